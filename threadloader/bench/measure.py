"""Timing: loaders over worker counts, the frame kernel alone in k processes at once, Python time per image."""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing

from threadloader.bench.data import BenchError
from threadloader.bench.usage import usage
from threadloader.bench.pipelines import BASELINE, CONFIGS, KERNEL_BOUND, LOADERS, build_loader

__all__ = [
    "Measurement",
    "compare_loaders",
    "count_images",
    "error_line",
    "kernel_bound_rate",
    "kernel_bound_rows",
    "make_row",
    "measure",
    "python_time_per_image",
    "run_comparison",
]

log = logging.getLogger("threadloader.bench")


@dataclasses.dataclass
class Measurement:
    """Result of :func:`measure`.

    ``images`` and ``seconds`` cover the timed part only (after warm-up);
    ``timed_items`` is how many items (samples or batches) it held and
    ``complete`` whether that reached the minimum asked for: a run whose timed
    part is shorter than that has no rate.
    """

    images: int
    seconds: float
    first_batch_s: float
    timed_items: int = 0
    complete: bool = True
    #: CPU seconds and page faults (minor + major) of the timed part, this
    #: process and its worker processes together (see :mod:`.usage`); None
    #: where /proc cannot tell.
    cpu_s: float | None = None
    page_faults: int | None = None

    @property
    def cores(self) -> float | None:
        """CPU cores kept busy on average during the timed part."""
        if self.cpu_s is None or self.seconds <= 0:
            return None
        return self.cpu_s / self.seconds

    @property
    def img_per_s(self) -> float:
        if not self.complete or self.seconds <= 0:
            return float("nan")
        return self.images / self.seconds


def count_images(item: Any) -> int:
    """Images in one loader item: ``N`` of a 4-D tensor (first element of a tuple/list/dict), else 1."""
    if isinstance(item, (tuple, list)) and item:
        item = item[0]
    elif isinstance(item, dict) and item:
        item = next(iter(item.values()))
    if isinstance(item, torch.Tensor) and item.dim() == 4:
        return int(item.shape[0])
    return 1


def _sync() -> None:
    # Asynchronous device work belongs to the batch: wait for it before the clock stops.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def measure(
    loader: Iterable[Any],
    *,
    max_items: int | None = None,
    warmup: int = 1,
    min_timed: int = 1,
    counter: Callable[[Any], int] = count_images,
) -> Measurement:
    """Iterate ``loader`` and time it after ``warmup`` items.

    Args:
        loader: any iterable of samples or batches.
        max_items: stop after this many items, warm-up included (None: one epoch).
        warmup: items at the start that are not timed (start-up cost).
        min_timed: fewest timed items for a rate (one batch); fewer gives
            ``complete=False`` and no rate.
        counter: images per item.

    Returns:
        A :class:`Measurement`.
    """
    start = time.perf_counter()
    first = None
    warm_start = start if warmup <= 0 else None
    warm_images = items = 0
    it = iter(loader)
    used_start = usage() if warmup <= 0 else None
    try:
        for item in it:
            items += 1
            n = counter(item)
            if first is None:
                _sync()
                first = time.perf_counter() - start
            if items == warmup:
                _sync()
                used_start = usage()
                warm_start = time.perf_counter()
            elif items > warmup:
                warm_images += n
            if max_items is not None and items >= max_items:
                break
        _sync()
        end = time.perf_counter()
        used_end = usage()
    finally:
        # Ends the epoch now (joins threads / stops processes) rather than at GC.
        close = getattr(it, "close", None) or getattr(it, "_shutdown_workers", None)
        del it
        if close is not None:
            close()
    timed = max(items - max(warmup, 0), 0)
    seconds = end - warm_start if warm_start is not None else 0.0
    used = used_end - used_start if used_start is not None and used_end is not None else None
    return Measurement(warm_images, seconds, first or 0.0, timed, timed >= max(min_timed, 1),
                       used.cpu_s if used else None, used.faults if used else None)


def make_row(
    config: str, workers: int, loader: str, m: Measurement | None, *, note: str = "",
    baseline: float | None = None, img_per_s: float | None = None,
) -> dict[str, Any]:
    """One result row (the keys of ``report.COLUMNS``).

    ``img/s`` is None when the measurement is incomplete or missing (never a
    made-up rate); ``ratio`` is ``img/s / baseline`` when both are known.
    """
    rate = img_per_s if img_per_s is not None else (m.img_per_s if m is not None else float("nan"))
    rate_or_none = None if rate != rate else round(rate, 1)  # NaN: no rate
    if m is not None and not m.complete and not note:
        note = f"too short: {m.timed_items} items timed after warm-up, under one batch"
    return {
        "config": config,
        "workers": workers,
        "loader": loader,
        "img/s": rate_or_none,
        "first_batch_s": round(m.first_batch_s, 3) if m is not None and m.first_batch_s else None,
        "images": m.images if m is not None else None,
        "cores": round(m.cores, 1) if m is not None and m.cores is not None else None,
        "faults/img": (round(m.page_faults / m.images, 1)
                       if m is not None and m.page_faults is not None and m.images else None),
        "ratio": round(rate_or_none / baseline, 2) if rate_or_none and baseline else None,
        "note": note,
    }


def in_flight_depth(workers: int, prefetch_factor: int = 2) -> int:
    """Items (batches, or samples unbatched) a loader with ``workers`` produces ahead of its consumer."""
    return prefetch_factor * workers


def run_comparison(
    root: str | os.PathLike[str],
    *,
    configs: Sequence[str],
    workers: Sequence[int],
    batch_size: int = 32,
    max_batches: int = 20,
    warmup_batches: int = 1,
    size: int | tuple[int, int] = 224,
    device: str = "cuda",
    loaders: Sequence[str] = LOADERS,
    progress: bool = True,
    worker_processes: int | None = None,
    is_valid_file: Callable[[str], bool] | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    on_error: Callable[[BaseException, str, int, str], str] | None = None,
) -> list[dict[str, Any]]:
    """Measure every (config, workers, loader) cell, baseline first in each group.

    Args:
        root: ImageFolder-style root.
        configs: keys of ``CONFIGS`` (``gpu`` is dropped without CUDA).
        workers: worker counts.
        batch_size: images per batch.
        max_batches: timed-run length in batches (per-sample configs use
            ``max_batches * batch_size`` samples).
        warmup_batches: batches (or ``batch_size`` samples) not timed; at
            least :func:`in_flight_depth` items are always left untimed.
        size: output image size.
        device: the GPU device for the ``gpu`` config.
        loaders: which loaders to run (``pipelines.ALL_LOADERS`` for all).
        progress: show a tqdm bar on stderr.
        worker_processes: P for the threads-in-processes loader.
        is_valid_file: ImageFolder's file filter.
        on_row: called with each row as soon as it is measured (e.g. to
            append it to a CSV, so that an interruption keeps it).
        on_error: ``f(exc, config, workers, loader)`` for a cell that raised:
            returns the note of a row without a rate, or raises to stop the
            run. Without it the exception propagates.

    Returns:
        One row per cell (see :func:`make_row`); ``ratio`` is img/s over the
        ``DataLoader`` row of the same config and workers.
    """
    from threadloader.bench.report import progress_bar

    configs = [c for c in configs if c != "gpu" or torch.cuda.is_available()]
    order = sorted(loaders, key=lambda name: name != BASELINE)  # the ratio's denominator first
    cells = [(c, w, name) for c in configs for w in workers for name in order]
    rows: list[dict[str, Any]] = []
    with progress_bar(len(cells), progress, desc="measuring", unit="run") as bar:
        baseline: dict[tuple[str, int], float | None] = {}
        for config, w, name in cells:
            bar.set_description(f"{CONFIGS[config]} w={w} {name}")
            per = 1 if config != "resize" else batch_size
            # Items produced ahead during warm-up would be timed as if free:
            # skip at least what a loader keeps in flight (DataLoader's
            # prefetch_factor 2 per worker) before the clock starts.
            warm = max(warmup_batches * per, in_flight_depth(w))
            try:
                items = max_batches * per + warm
                loader = build_loader(
                    name, config, root, workers=w, batch_size=batch_size, size=size, device=device,
                    worker_processes=worker_processes, is_valid_file=is_valid_file,
                    # as many samples as the run times, cycling over a small folder
                    num_samples=items * (batch_size if config != "resize" else 1),
                )
                m = measure(loader, max_items=items, warmup=warm, min_timed=per)
                row = make_row(CONFIGS[config], w, name, m, baseline=baseline.get((config, w)))
            except Exception as exc:  # noqa: BLE001 - handed to on_error, which decides
                if on_error is None:
                    raise
                row = make_row(CONFIGS[config], w, name, None, note=on_error(exc, config, w, name))
            if name == BASELINE:
                baseline[(config, w)] = row["img/s"]
            log.info("measured %s", row)
            rows.append(row)
            if on_row is not None:
                on_row(row)
            bar.set_postfix_str(f"{row['img/s']:.0f} img/s" if row["img/s"] else "no rate")
            bar.update(1)
    return rows


#: What a kernel-bound child reports when the start barrier broke under it (another child failed or was late).
_BARRIER_BROKEN = "barrier broken"


def error_line(exc: BaseException) -> str:
    """``"TypeName: first line of the message"`` (just the type name when the message is empty)."""
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _kernel_bound_child(
    rank: int, processes: int, files: Sequence[str], size: int, seconds: float, rounds: int,
    max_images: int | None, start_timeout: float, barrier: Any, results: Any, parent_pid: int,
) -> None:
    """One process of :func:`kernel_bound_rate`: warm up, then per round wait for the others and run the kernel.

    Reports exactly one ``(rank, [(images, seconds) per round], error)`` on
    ``results``; ``error`` is None, a one-line description of what failed, or
    ``_BARRIER_BROKEN``. A failing child reports before it breaks the barrier,
    so that the parent hears the cause before the others' echoes.
    """
    try:
        from threadloader.bench.pipelines import FrameLoader

        torch.set_num_threads(1)  # one core per process: the bound of k single-thread workers
        kernel = FrameLoader((size, size), eager=True)
        offset = rank * len(files) // processes  # each starts elsewhere, so the k do not read the same file
        kernel(files[offset % len(files)])  # first-call costs (imports, allocator) are not the kernel's
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it as one line
        results.put((rank, [], error_line(exc)))
        barrier.abort()
        return
    timed: list[tuple[int, float]] = []
    n = 0
    for _ in range(rounds):
        try:
            barrier.wait(start_timeout)  # all start each round together
        except threading.BrokenBarrierError:
            results.put((rank, [], _BARRIER_BROKEN))
            return
        try:
            done, start = 0, time.perf_counter()
            while (done == 0 or time.perf_counter() - start < seconds) and (max_images is None or done < max_images):
                if os.getppid() != parent_pid:
                    return  # the parent is gone: nobody reads the result, and no orphan keeps running
                kernel(files[(offset + n) % len(files)])
                n += 1
                done += 1
            timed.append((done, time.perf_counter() - start))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it as one line
            results.put((rank, [], error_line(exc)))
            barrier.abort()
            return
    results.put((rank, timed, None))


def kernel_bound_rate(
    files: Sequence[str | os.PathLike[str]],
    size: int,
    processes: int,
    *,
    seconds: float = 1.0,
    rounds: int = 3,
    max_images: int | None = None,
    start_timeout: float = 120.0,
) -> tuple[float, int]:
    """The frame kernel alone in ``processes`` independent processes at once: their summed rate.

    Each process (spawned, so it inherits no thread or OpenMP state) sets
    torch to one thread, builds ``FrameLoader((size, size), eager=True)``,
    warms up on one file, then, ``rounds`` times, waits until all are ready
    and decodes and resizes ``files`` (cycled, each from a different offset)
    for ``seconds`` (at least one image, at most ``max_images``). In a round
    all ran concurrently for the same time, so the sum of the per-process
    rates is what the hardware gives ``processes`` workers running nothing but
    the kernel, memory-bandwidth and cache contention included. The best
    round counts: other work on the machine slows a round, never speeds it up.

    Args:
        files: image files.
        size: output side.
        processes: how many processes run at once.
        seconds: timed run per round.
        rounds: timed runs (the best one is kept).
        max_images: cap per process and round (None: time alone bounds it).
        start_timeout: seconds for all processes to start and warm up (and
            for each round's start).

    Returns:
        ``(img/s summed over the processes, images they timed in that round)``.

    Raises:
        ValueError: ``processes`` or ``rounds`` below 1, or no files.
        BenchError: a process failed (its error, one line), died, or the
            processes did not all start in time. Every process is stopped and
            joined before this returns or raises, Ctrl-C included.
    """
    if processes < 1 or rounds < 1:
        raise ValueError(f"processes and rounds must be >= 1; got {processes} and {rounds}")
    if not files:
        raise ValueError("kernel_bound_rate needs at least one file")
    # spawn: a fresh interpreter per process, so no parent thread, lock or OpenMP pool is inherited.
    ctx = torch.multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes)
    results = ctx.Queue()
    paths = [os.fspath(f) for f in files]
    procs = [
        ctx.Process(
            target=_kernel_bound_child, name=f"threadloader-kernel-bound-{rank}", daemon=True,
            args=(rank, processes, paths, size, seconds, rounds, max_images, start_timeout, barrier, results,
                  os.getpid()),
        )
        for rank in range(processes)
    ]
    what = f"kernel bound ({processes} process{'es' if processes > 1 else ''})"
    done: dict[int, list[tuple[int, float]]] = {}
    broken: set[int] = set()
    try:
        for p in procs:
            p.start()
        # Start-up, warm-up and the runs; past this something is stuck (each barrier wait times out sooner).
        limit = start_timeout + rounds * (seconds + start_timeout) + 60.0
        deadline = time.monotonic() + limit
        while len(done) + len(broken) < processes:
            try:
                rank, timed, error = results.get(timeout=0.2)
            except queue.Empty:
                silent = [p for r, p in enumerate(procs) if r not in done and r not in broken and p.exitcode is not None]
                if silent:
                    p = silent[0]
                    raise BenchError(f"{what}: {p.name} exited with code {p.exitcode} without a result") from None
                if time.monotonic() > deadline:
                    raise BenchError(f"{what}: no result after {limit:.0f} s") from None
                continue
            if error == _BARRIER_BROKEN:
                broken.add(rank)  # an echo: the cause (a failed or late process) reports on its own
            elif error is not None:
                raise BenchError(f"{what}: process {rank} failed: {error}")
            else:
                done[rank] = timed
        if broken:
            raise BenchError(f"{what}: the processes did not all start and warm up within {start_timeout:g} s")
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            if p.pid is not None:  # started
                p.join(10.0)
                if p.is_alive():
                    p.kill()
                    p.join()
        results.close()
        results.join_thread()
    per_round = [
        (sum(t[i][0] / t[i][1] for t in done.values() if t[i][1] > 0), sum(t[i][0] for t in done.values()))
        for i in range(rounds)
    ]
    return max(per_round)


def kernel_bound_rows(
    configs: Sequence[str], workers: Sequence[int], rates: dict[int, tuple[float, int]], cores: int | None = None,
    baselines: dict[tuple[str, int], float | None] | None = None,
    errors: dict[int, str] | None = None,
) -> list[dict[str, Any]]:
    """The kernel bound per (config, workers), measured with k = min(workers, cores) processes.

    Args:
        configs: keys of ``CONFIGS``.
        workers: worker counts.
        rates: k -> ``(img/s, images timed)`` from :func:`kernel_bound_rate`
            with k processes; one measurement serves every worker count with
            the same k.
        cores: the core count (default ``os.cpu_count()``).
        baselines: (config label, workers) -> DataLoader's img/s, for ``ratio``.
        errors: k -> why the measurement with k processes failed; such rows
            get no rate and say why in ``note``.

    Returns:
        One row per config and worker count (``images``: the images the
        measurement timed, all processes together, in its best round).
    """
    cores = cores or os.cpu_count() or 1
    rows = []
    for config in configs:
        for w in workers:
            k = min(w, cores)
            baseline = (baselines or {}).get((CONFIGS[config], w))
            if k not in rates:
                note = f"failed: {(errors or {}).get(k, f'not measured with {k} processes')}"[:200]
                rows.append(make_row(CONFIGS[config], w, KERNEL_BOUND, None, note=note, baseline=baseline))
                continue
            rate, images = rates[k]
            row = make_row(
                CONFIGS[config], w, KERNEL_BOUND, None, img_per_s=rate, baseline=baseline,
                note=f"measured: {k} independent process{'es' if k > 1 else ''}, 1 thread each, kernel alone",
            )
            row["images"] = images
            rows.append(row)
    return rows


def _native_frame_calls(
    paths: Sequence[str], size: tuple[int, int], batch_size: int
) -> float:
    """Seconds per image of the frame path's native calls alone, timed directly.

    The same native work, on the same data flow, as the frame path does: per
    batch, each file is read (``open`` + ``read``) and its JPEG header parsed
    and decoded (at the DCT scale ``decode_image`` picks by default) into its
    own buffer -- a batch's frames all live until collate, as in the path --
    then each decoded image is resized by torch's uint8 kernel straight into
    its slot of a reused batch. Buffers are allocated once, as the path's
    pools do after their first batch. The loop around the calls is as thin as
    Python allows; the difference with the path is the Python around them.
    """
    from threadloader.io._codec import jpeg
    import numpy as np

    from threadloader._torch_compat import resize_op

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
            with open(path, "rb") as f:
                data = f.read()
            height, width = jpeg.decode_jpeg_header(data)[:2]
            kwargs = {}
            for factor in (8, 4, 2):  # decode_image's default reducing_gap of 2
                if height >= h * factor * 2 and width >= w * factor * 2:
                    kwargs = dict(min_height=-(-height // factor), min_width=-(-width // factor))
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
    from threadloader.bench.pipelines import frame_dataset
    from threadloader.frames import frame_collate

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
        next(it)  # thread start-up and first-call costs are not per image
        start = time.perf_counter()
        for _ in it:
            pass
        path_s = min(path_s, (time.perf_counter() - start) / n)
        del it, loader
        _native_frame_calls(paths[:batch_size], (size, size), batch_size)  # warm-up
        natives.append(_native_frame_calls(paths, (size, size), batch_size))
    return path_s, min(natives), max(natives) - min(natives), n


#: The small JPEGs of the quiet Python-time measurement: (height, width) -> output side.
SMALL_IMAGE = (48, 64)
SMALL_SIZE = 32


def _small_jpegs(folder: Path, count: int, seed: int = 0) -> list[Path]:
    """``count`` small photo-like JPEGs (blocky noise, :data:`SMALL_IMAGE`) in ``folder/c0``."""
    import numpy as np

    from threadloader.io._codec import jpeg

    rng = np.random.default_rng(seed)
    out = folder / "c0"
    out.mkdir(parents=True, exist_ok=True)
    h, w = SMALL_IMAGE
    paths = []
    for i in range(count):
        blocks = rng.integers(0, 256, (h // 8, w // 8, 3), dtype=np.uint8)
        pixels = np.ascontiguousarray(blocks.repeat(8, 0).repeat(8, 1))
        path = out / f"{i}.jpg"
        path.write_bytes(jpeg.encode_jpeg(pixels, quality=90, colorspace="RGB"))
        paths.append(path)
    return paths


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
      time is ~50x the difference and varies by more than it from run to run;
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
            small = _small_jpegs(Path(tmp), min(images, 64))
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


def compare_loaders(
    factories: dict[str, Callable[[int], Iterable[Any]]],
    workers: Sequence[int],
    *,
    max_items: int | None,
    warmup: int = 1,
    config: str = "",
    progress: bool = False,
    baseline: str = "DataLoader",
) -> list[dict[str, Any]]:
    """Measure named loaders over worker counts (what the examples print).

    Args:
        factories: name -> ``f(workers)`` building a fresh iterable.
        workers: worker counts.
        max_items: items (samples or batches) per timed run, warmup included.
        warmup: items not timed.
        config: label for the ``config`` column.
        progress: show a tqdm bar on stderr.
        baseline: the name whose img/s is the denominator of ``ratio``.

    Returns:
        Rows with the keys of ``report.COLUMNS``.
    """
    from threadloader.bench.report import progress_bar

    rows: list[dict[str, Any]] = []
    names = sorted(factories, key=lambda name: name != baseline)
    with progress_bar(len(factories) * len(workers), progress, desc=config, unit="run") as bar:
        for w in workers:
            base = None
            for name in names:
                bar.set_description(f"{config} w={w} {name}")
                m = measure(factories[name](w), max_items=max_items, warmup=warmup)
                rows.append(make_row(config, w, name, m, baseline=base))
                if name == baseline:
                    base = rows[-1]["img/s"]
                log.info("measured %s", rows[-1])
                bar.update(1)
    # Keep the caller's loader order within each worker count.
    order = {name: i for i, name in enumerate(factories)}
    rows.sort(key=lambda r: (workers.index(r["workers"]), order[r["loader"]]))
    return rows
