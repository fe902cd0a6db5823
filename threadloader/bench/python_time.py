"""Python time per image of the frame path: its single-thread time minus that of its native calls alone."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from threadloader.images.datagen import make_imagenet_like

__all__ = ["SMALL_IMAGE", "SMALL_SIZE", "native_calls_label", "python_time_per_image"]


def native_calls_label() -> str:
    """What :func:`_native_frame_calls` times on this install, for the bench's report."""
    from threadloader.images import decode

    if decode._native_load is not None:
        return "threadloader's C part: read + decode per image, resize as frame_collate does"
    return "file read, simplejpeg decode, torch resize into the batch"


def _native_frame_calls(
    paths: Sequence[str], size: tuple[int, int], batch_size: int
) -> float:
    """Seconds per image of the frame path's native calls alone: those of the C part where it is installed."""
    from threadloader.images import decode

    if decode._native_load is not None:
        return _c_part_calls(paths, size, batch_size)
    return _python_path_calls(paths, size, batch_size)


def _c_part_calls(paths: Sequence[str], size: tuple[int, int], batch_size: int) -> float:
    """Seconds per image of the C part's calls alone, on the frame path's data flow.

    Per image, one call reads the file and decodes it at the DCT scale
    ``decode_image`` picks by default, into a buffer of its own (a batch's
    frames all live until collate). Per batch, one call resizes them into a
    reused batch, or torch's op resizes each where ``frame_collate`` would
    take it (large sources on few cores). The edge crop of a scaled decode
    is the path's.
    """
    import numpy as np

    from threadloader._platform.torch_compat import resize_op
    from threadloader.images import decode, frames

    h, w = size
    load = decode._native_load
    assert load is not None
    batch = np.empty((batch_size, h, w, 3), dtype=np.uint8)
    slots = torch.from_numpy(batch).permute(0, 3, 1, 2).split(1)
    from_numpy = torch.from_numpy
    buffers = [bytearray(1) for _ in range(batch_size)]
    sources: list[Any] = [None] * batch_size
    start = time.perf_counter()
    for first in range(0, len(paths), batch_size):
        chunk = paths[first:first + batch_size]
        for j, path in enumerate(chunk):
            status, _, pixels, height, width, factor = load(path, h, w, 2.0, -1, False, False, buffers[j])
            if status:
                raise RuntimeError(f"the C part did not decode {path}")
            if pixels is not buffers[j]:  # too small: the next batch has one that fits, as the path's pool
                buffers[j] = bytearray(decode.native_nbytes(height, width, factor))
            sources[j] = decode.native_image(pixels, height, width, factor)
        resize_batch = frames._native_resize_for(sources[0])
        if resize_batch is not None:
            resize_batch(sources[:len(chunk)], batch[:len(chunk)], h, w)
        else:
            for j in range(len(chunk)):
                resize_op(from_numpy(sources[j][None].transpose(0, 3, 1, 2)), size, False, out=slots[j])
    return (time.perf_counter() - start) / max(len(paths), 1)


def _python_path_calls(
    paths: Sequence[str], size: tuple[int, int], batch_size: int
) -> float:
    """Seconds per image of the Python frame path's native calls alone, timed directly.

    The same native work, on the same data flow, as the frame path does: per
    batch, each file is read (open, fstat, read to the end, close), its JPEG
    header parsed and the image decoded (at the DCT scale ``decode_image``
    picks by default) into its own buffer -- a batch's frames all live until
    collate, as in the path -- then each decoded image is resized by torch's
    uint8 kernel straight into its slot of a reused batch. Buffers are reused
    from batch to batch, as the path's pools do. The loop around the calls is
    as thin as Python allows; the difference with the path is the Python
    around them.
    """
    import numpy as np

    from threadloader._platform.torch_compat import resize_op
    from threadloader.images import decode
    from threadloader.images._codec import jpeg

    h, w = size
    batch = torch.empty((batch_size, h, w, 3), dtype=torch.uint8)
    slots = batch.permute(0, 3, 1, 2).split(1)
    buffers = [np.empty(0, dtype=np.uint8)] * batch_size
    decoded: list[Any] = [None] * batch_size
    from_numpy = torch.from_numpy
    start = time.perf_counter()
    for first in range(0, len(paths), batch_size):
        chunk = paths[first:first + batch_size]
        for j, path in enumerate(chunk):
            fd = os.open(path, os.O_RDONLY)  # the path's five system calls, no Python around them
            data = os.read(fd, os.fstat(fd).st_size + 1)
            os.read(fd, 1)
            os.close(fd)
            height, width = jpeg.decode_jpeg_header(data)[:2]
            kwargs = {}
            for factor in (8, 4, 2):  # decode_image's default reducing_gap of 2
                if height >= h * factor * 2 and width >= w * factor * 2:
                    rows, cols = decode.scaled_dims(height, width, factor)
                    kwargs = dict(min_height=rows, min_width=cols)
                    break
            if buffers[j].nbytes < height * width * 3:
                buffers[j] = np.empty(height * width * 3, dtype=np.uint8)
            decoded[j] = jpeg.decode_jpeg(data, colorspace="RGB", strict=True, buffer=buffers[j], **kwargs)
        for j in range(len(chunk)):
            resize_op(from_numpy(decoded[j][None].transpose(0, 3, 1, 2)), size, False, out=slots[j])
    return (time.perf_counter() - start) / max(len(paths), 1)


def _path_minus_native(
    root: str | os.PathLike[str], files: Sequence[Path], size: int, batch_size: int, images: int,
    rounds: int, is_valid_file: Callable[[str], bool] | None = None,
) -> tuple[float, float, float, int] | None:
    """Best-of-``rounds`` seconds per image of the frame path and of its native calls, interleaved.

    Returns:
        ``(path_s, native_s, native_spread_s, images timed)`` -- the spread is
        the native time's slowest round minus its fastest -- or None when no
        JPEG of ``files`` is a sample of the ImageFolder at ``root``.
    """
    from threadloader import ThreadDataLoader
    from threadloader._platform.torch_compat import shutdown_workers
    from threadloader.bench.pipelines import frame_dataset
    from threadloader.images.frames import frame_collate

    jpegs = [f for f in files if f.suffix.lower() in (".jpg", ".jpeg")][:images]
    if not jpegs:
        return None
    ds = frame_dataset(root, size, is_valid_file=is_valid_file)
    wanted = {os.path.abspath(f) for f in jpegs}
    found = [i for i, (p, _) in enumerate(ds.samples) if os.path.abspath(p) in wanted]
    if not found:
        return None
    # Whole batches, cycling over the files when there are few; the first batch is not timed.
    n = max(images // batch_size, 1) * batch_size
    indices = [found[k % len(found)] for k in range(n + batch_size)]
    paths = [ds.samples[i][0] for i in indices[batch_size:]]
    path_s = float("inf")
    natives = []
    # Alternate the two and keep each one's best: a busy machine slows single
    # runs, never speeds them up.
    for _ in range(rounds):
        loader = ThreadDataLoader(ds, batch_size=batch_size, sampler=indices, num_workers=1,
                                  collate_fn=frame_collate)
        it = iter(loader)
        try:
            next(it)  # thread start-up and first-call costs are not per image
            start = time.perf_counter()
            for _ in it:
                pass
            path_s = min(path_s, (time.perf_counter() - start) / n)
        finally:
            # Joins the worker now: a worker's error keeps the iterator in its
            # traceback, which the caller may hold for as long as it likes.
            shutdown_workers(it)
            del it, loader
        _native_frame_calls(paths[:batch_size], (size, size), batch_size)  # warm-up
        natives.append(_native_frame_calls(paths, (size, size), batch_size))
    return path_s, min(natives), max(natives) - min(natives), n


#: The small JPEGs of the quiet Python-time measurement (typical (height, width), as
#: ``datagen.make_imagenet_like`` scatters sizes around it) -> output side.
SMALL_IMAGE = (48, 64)
SMALL_SIZE = 32


def python_time_per_image(
    root: str | os.PathLike[str],
    files: Sequence[Path],
    *,
    size: int,
    batch_size: int,
    images: int = 128,
    is_valid_file: Callable[[str], bool] | None = None,
    rounds: int = 5,
) -> dict[str, float] | None:
    """Single-thread time per image of the frame path minus that of its native calls alone.

    The frame path: ImageFolder + ``decode_image(size)`` + ``frame_collate``
    through ThreadDataLoader with one worker thread, torch on one thread. The
    native calls: see :func:`_native_frame_calls` (file read, header, decode,
    resize, on the same files and the same data flow). The difference is the
    Python around them: ImageFolder, decode_image, the buffer pools, the
    engine, collate.

    Measured twice, each as the best of ``rounds`` interleaved runs:

    * on the bench's JPEGs (``files``): the figure as defined, but the native
      time is many times the difference and varies by more than it from run to run;
    * on small JPEGs written to a temporary folder (:data:`SMALL_IMAGE` to
      :data:`SMALL_SIZE`): the same calls on the same objects -- the Python
      around them does not depend on the pixel count -- with little native
      time, so the difference is resolved. This is the headline figure.

    Returns:
        ``python_us``, ``path_us``, ``native_us`` and ``images`` (small JPEGs),
        ``data_python_us``, ``data_path_us``, ``data_native_us``,
        ``data_native_spread_us`` (its slowest round minus its fastest) and
        ``data_images`` (the bench's JPEGs, absent when ``files`` holds no
        JPEG); or None when neither could be measured.
    """
    import tempfile

    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    result: dict[str, float] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="threadloader-pytime-") as tmp:
            # Photo-like, sizes scattered around SMALL_IMAGE (all under the
            # DCT-scaling threshold, as the bench's 375x500 images are for 224).
            small = sorted(make_imagenet_like(tmp, num_classes=1, images_per_class=min(images, 64),
                                              size=SMALL_IMAGE).rglob("*.JPEG"))
            measured = _path_minus_native(tmp, small, SMALL_SIZE, batch_size, max(images, 256), rounds)
        if measured is not None:
            path_s, native_s, _, n = measured
            result.update(path_us=path_s * 1e6, native_us=native_s * 1e6,
                          python_us=(path_s - native_s) * 1e6, images=float(n))
        measured = _path_minus_native(root, files, size, batch_size, images, rounds, is_valid_file)
        if measured is not None:
            path_s, native_s, spread_s, n = measured
            result.update(data_path_us=path_s * 1e6, data_native_us=native_s * 1e6,
                          data_python_us=(path_s - native_s) * 1e6, data_images=float(n),
                          data_native_spread_us=spread_s * 1e6)
    finally:
        torch.set_num_threads(prev)
    return result or None
