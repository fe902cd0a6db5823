"""Decoded images that collate straight into one batch buffer.

A :class:`Frame` wraps decoded HWC uint8 pixels in a NumPy array, possibly with
a pending resize (what ``decode_image(..., size=...)`` returns): no torch
tensor is made per image.

:func:`frame_collate` walks a batch exactly like
``torch.utils.data.default_collate``. Frames at one position become one
``(N, H, W, C)`` buffer. Each pending resize runs straight into its slot; other
frames are copied into theirs once. The batch is returned as the
``(N, C, H, W)`` channels-last view of that buffer. Its shape and dtype are
those of ``PILToTensor`` + ``default_collate``; its values are within one level
of theirs. With ``normalize`` or ``dtype`` the batch is
converted to floats too, in the calling (worker) thread.

Batch buffers come from a pool (:mod:`threadloader.images.buffers`) and are reused only
once every tensor, view or array of the batch is gone; pinned ones come from
torch's caching host allocator.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Sequence

import numpy as np
import torch

from .._platform import torch_compat as _torch_compat
from .._platform.fork import renew_after_fork
from ..stats import cpu as _cpu
from ..worker import context as _context
from ..worker.context import pin_memory_requested
from .buffers import host_pool

__all__ = ["Frame", "frame_collate"]

_from_numpy = torch.from_numpy
_resize = _torch_compat.resize_op
#: ``resize_into(sources, out, h, w)``: the image path's native resize (threadloader.images._native),
#: bit-identical to ``_resize``, one native call per batch; installed by ``threadloader.images.decode``
#: where it is built, else None (torch's op resizes, one call per image).
_native_resize: Any = None
#: Sources larger than this many pixels go to torch's kernel on a machine of
#: :data:`_FEW_CORES` usable cores or fewer. There torch's kernel costs less
#: CPU per large image, and the GIL hand-off of one call per image is small
#: beside it. With more cores the GIL hand-offs limit threads, and the one
#: native call per batch wins. Both give the same pixels.
_LARGE_SOURCE_PIXELS = 1 << 16
_FEW_CORES = 4
_few_cores = _cpu.usable_cores() <= _FEW_CORES


class Frame:
    """Decoded image pixels, height x width x channels, uint8.

    Args:
        array: ``(H, W, C)`` uint8 array (any strides). It is held, not copied.

    Raises:
        TypeError: if ``array`` is not a uint8 NumPy array.
        ValueError: if it is not 3-dimensional.
    """

    # (pixels, pending (h, w) or None), one attribute so that it is read and
    # replaced as a whole: two threads materialising one frame both see a
    # consistent pair (and compute the same pixels).
    __slots__ = ("_state",)

    #: Memory layout of :meth:`numpy` (height, width, channels).
    layout = "HWC"

    def __init__(self, array: np.ndarray) -> None:
        if not isinstance(array, np.ndarray) or array.dtype != np.uint8:
            raise TypeError(f"Frame needs a uint8 numpy array, got {type(array).__name__} "
                            f"{getattr(array, 'dtype', '')}".rstrip())
        if array.ndim != 3:
            raise ValueError(f"Frame needs an (H, W, C) array, got shape {tuple(array.shape)}")
        self._state: tuple[np.ndarray, tuple[int, int] | None] = (array, None)

    @property
    def height(self) -> int:
        return self.shape[0]

    @property
    def width(self) -> int:
        return self.shape[1]

    @property
    def channels(self) -> int:
        return self.shape[2]

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(height, width, channels)`` (after any pending resize; known without running it)."""
        arr, size = self._state
        if size is None:
            return arr.shape  # type: ignore[return-value]
        return size[0], size[1], arr.shape[2]

    def numpy(self) -> np.ndarray:
        """The ``(H, W, C)`` uint8 pixels (the frame's own array, not a copy).

        A pending resize runs here into a new array the frame keeps. Threads
        reading a pending frame at once may each run it, but all get the
        array the frame keeps.
        """
        arr, size = self._state
        if size is None:
            return arr
        out = np.empty((size[0], size[1], arr.shape[2]), dtype=np.uint8)
        _resize_frames([arr], [size], out[None])
        with _publish_lock:  # the first reader to finish publishes; the others return its array
            kept, pending = self._state
            if pending is None:
                return kept
            self._state = (out, None)
        return out

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        arr = self.numpy()
        if copy:
            return np.array(arr, dtype=dtype, copy=True)
        if dtype is None or np.dtype(dtype) == arr.dtype:
            return arr
        if copy is False:
            # NumPy 2's contract, as it answers for an ndarray: copy=False
            # means "never copy", so a dtype change is an error.
            raise ValueError("Unable to avoid copy while creating an array as requested.")
        return arr.astype(dtype)

    def to_tensor(self) -> torch.Tensor:
        """The pixels as a ``(C, H, W)`` uint8 tensor, as ``PILToTensor`` gives.

        Shares memory with the frame when its array is writable and has no
        negative stride (a channels-last strided view), copies otherwise.
        """
        arr = self.numpy()
        # torch.from_numpy warns on read-only arrays and refuses negative
        # strides (a flipped view, e.g. OpenCV's BGR -> RGB ``[..., ::-1]``).
        if not arr.flags.writeable or min(arr.strides) < 0:
            arr = arr.copy()
        return torch.from_numpy(arr).permute(2, 0, 1)

    def __repr__(self) -> str:
        h, w, c = self.shape
        return f"Frame(height={h}, width={w}, channels={c}, layout='HWC')"

    def __getstate__(self) -> tuple[np.ndarray]:
        # Resized here, in the pickling (worker) process: what travels is the
        # final pixels. A tuple: pickle protocols 0 and 1 test the state's
        # truth, which an array has none of.
        return (self.numpy(),)

    def __setstate__(self, state: tuple[np.ndarray] | np.ndarray) -> None:
        self._state = (state[0] if isinstance(state, tuple) else state, None)


#: Publishes a pending frame's resized array (``Frame.numpy``): held for a store, never a resize.
_publish_lock = threading.Lock()
renew_after_fork(__name__, "_publish_lock")


def _deferred(array: np.ndarray, size: tuple[int, int] | None) -> Frame:
    """A frame of decoded ``array`` (writable HWC uint8) to be resized to ``size`` (h, w).

    Internal: the decoders' arrays need no validation.
    """
    frame = _new_frame(Frame)
    frame._state = (array, size)
    return frame


_new_frame = object.__new__


def _batch_buffer(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised batch tensor, allocated where it will end up."""
    if pin_memory_requested():
        # The loader will pin the batch: allocate it pinned, saving a copy.
        # torch's caching host allocator reuses pinned blocks only after their
        # non-blocking copies completed: it is the pool for pinned memory.
        return torch.empty(shape, dtype=dtype, pin_memory=True)
    arena = _context.child_arena()
    if arena is not None:
        # A worker_processes child: shared memory the loader's process maps
        # once and hands back when the consumer lets go (procs/arena.py).
        return arena.take(shape, dtype)
    info = torch.utils.data.get_worker_info()
    if info is not None and getattr(info, "worker_method", "process") != "thread":
        # DataLoader's worker process: build the batch in shared memory, as
        # default_collate does, so sending it to the main process copies
        # nothing. Not pooled: the main process keeps using it after this
        # one lets go.
        return _torch_compat.new_shared(shape, dtype)
    return host_pool.take(shape, dtype)


_local = threading.local()


def _scratch(shape: tuple[int, int, int, int]) -> torch.Tensor:
    """This thread's uint8 staging batch (for a converted batch); never leaves the thread."""
    n = shape[0] * shape[1] * shape[2] * shape[3]
    buf = getattr(_local, "scratch", None)
    if buf is None or buf.numel() < n:
        buf = _local.scratch = torch.empty(n, dtype=torch.uint8)
    return buf[:n].view(shape)


def _collate_frames(batch: Any, *, collate_fn_map: Any = None, transform: Any = None) -> torch.Tensor:
    # The per-image loop is the serial part of a threaded loader (it holds the
    # GIL): no torch tensor is made per image except the resize's source, no
    # attribute lookups beyond the frame's state.
    shape = batch[0].shape
    states: list[tuple[Any, Any]] = []
    append = states.append
    for index, frame in enumerate(batch):
        if not isinstance(frame, Frame):
            raise TypeError(
                f"frame_collate: batch mixes Frame with {type(frame).__name__} at position {index}"
            )
        state = frame._state
        arr, size = state
        if (arr.shape if size is None else (size[0], size[1], arr.shape[2])) != shape:
            raise ValueError(
                f"frame_collate: frames in a batch must have the same size, but sample 0 is "
                f"{_size(shape)} and sample {index} is {_size(frame.shape)}. Decode to a fixed "
                f"size (decode_image(..., size=(H, W)) or RandomResizedCropLoader(size)) or add "
                f"a resize/crop transform."
            )
        append(state)
    full = (len(states), *shape)
    pixels = _batch_buffer(full, torch.uint8) if transform is None else _scratch(full)
    dst = pixels.numpy()
    pending = None
    for i, (arr, size) in enumerate(states):
        if size is None:
            # One copy per frame; numpy releases the GIL for large plain copies.
            np.copyto(dst[i], arr, casting="no")
        elif pending is None:
            pending = i
    if pending is not None:
        # The resizes write straight into the batch: no per-image result.
        _resize_frames([arr for arr, _ in states], [size for _, size in states], dst, first=pending)
    if transform is None:
        return pixels.permute(0, 3, 1, 2)
    out = _batch_buffer(full, transform.dtype).permute(0, 3, 1, 2)
    transform.normalize_into(pixels.permute(0, 3, 1, 2), out)
    return out


def _native_resize_for(source: np.ndarray) -> Any:
    """The native batch resize for a batch of sources like ``source``, or None: torch's op, once per image."""
    if _few_cores and source.shape[0] * source.shape[1] > _LARGE_SOURCE_PIXELS:
        return None
    return _native_resize


def _resize_frames(arrays: list[np.ndarray], sizes: list[Any], dst: np.ndarray, first: int = 0) -> None:
    """Resize ``arrays[i]`` into ``dst[i]`` for each ``sizes[i]`` that is not None (a pending resize).

    One native call for them all where the image path installed it (the GIL
    is released once per batch); else torch's op, once per image. Both give
    the same pixels. A batch of large sources on a machine of few cores takes
    torch's op (see :data:`_LARGE_SOURCE_PIXELS`).
    """
    native = _native_resize_for(arrays[first])
    if native is not None:
        sources = [arr if size is not None else None for arr, size in zip(arrays, sizes)]
        try:
            native(sources, dst, dst.shape[1], dst.shape[2])
            return
        except ValueError:  # an array the native kernel does not take (not packed RGB rows)
            pass
    slots = _from_numpy(dst).permute(0, 3, 1, 2).split(1)
    for i in range(first, len(arrays)):
        size = sizes[i]
        if size is not None:
            _resize(_from_numpy(arrays[i][None].transpose(0, 3, 1, 2)), size, False, out=slots[i])


def _collate_arrays(collate_arrays: Any, batch: Any, *, collate_fn_map: Any = None) -> Any:
    # The batch's first sample picks the handler: arrays then frames would
    # otherwise fail in torch.as_tensor with "Could not infer dtype of Frame".
    for index, sample in enumerate(batch):
        if type(sample) is Frame:
            raise TypeError(
                f"frame_collate: batch mixes Frame with {type(batch[0]).__name__} at position 0 "
                f"(first Frame at position {index})"
            )
    return collate_arrays(batch, collate_fn_map=collate_fn_map)


def _size(shape: tuple[int, ...]) -> str:
    h, w, c = shape
    return f"{h}x{w} (HxW) with {c} channels"


#: Validated conversions by the *values* of their arguments (a tensor or array
#: hashes by identity: keyed so, a fresh tensor per call would add an entry each
#: time, and one changed in place would keep its old values). Bounded.
_transforms: dict[Any, Any] = {}
_TRANSFORMS_KEPT = 64


def _values_key(normalize: Any) -> Any:
    """``normalize`` as a hashable key of its values, or None if it has no plain numeric values."""
    if normalize is None:
        return ()
    try:
        mean, std = normalize
        parts = []
        for v in (mean, std):
            a = np.asarray(v.detach().cpu() if isinstance(v, torch.Tensor) else v, dtype=np.float64)
            parts.append((a.shape, a.tobytes()))
        return tuple(parts)
    except (TypeError, ValueError, RuntimeError):
        return None  # ImageTransform says what is wrong with it


def _transform(normalize: Any, dtype: torch.dtype | None) -> Any:
    """The (cached, validated) uint8 -> float conversion for these arguments."""
    if dtype is None:
        dtype = torch.float32
    values = _values_key(normalize)
    key = None if values is None else (values, dtype)
    transform = None if key is None else _transforms.get(key)
    if transform is None:
        from .transform import ImageTransform

        # The same fused ``x * scale + bias`` as to_device's: bit-identical
        # results whichever stage normalizes.
        transform = ImageTransform(normalize=normalize, dtype=dtype, channels_last=True)
        if key is not None:
            if len(_transforms) >= _TRANSFORMS_KEPT:
                _transforms.clear()  # a cache: rebuilt on demand
            _transforms[key] = transform
    return transform


def frame_collate(
    batch: Any,
    *,
    normalize: tuple[Sequence[float], Sequence[float]] | None = None,
    dtype: torch.dtype | None = None,
) -> Any:
    """Collate a batch like ``default_collate``, with frames stacked into one buffer.

    The batch is walked exactly as ``torch.utils.data.default_collate`` walks
    it (sequences, mappings, namedtuples); every non-frame leaf is collated as
    it would. Frames at one position become a ``(N, C, H, W)`` uint8 tensor,
    a channels-last view of one ``(N, H, W, C)`` buffer: a frame's pending
    resize runs straight into its slot. The buffer is allocated pinned when
    the running ThreadDataLoader pins memory, else taken from a pool that
    reuses it only after every tensor/array of the batch is gone.

    With ``normalize`` (or a floating ``dtype``) frames become a float batch
    ``(x / 255 - mean) / std`` (``x / 255`` without ``normalize``), channels-last,
    computed here -- in the worker thread -- with the same fused arithmetic as
    :func:`~threadloader.to_device`. Use it as
    ``collate_fn=functools.partial(frame_collate, normalize=(mean, std))``.

    Args:
        batch: list of samples.
        normalize: ``(mean, std)``, two sequences with one value per channel
            (or a one-element sequence each, for all channels), in the [0, 1]
            pixel scale, or None.
        dtype: floating dtype of converted image batches (default float32 when
            ``normalize`` is given); None with ``normalize=None`` keeps uint8.

    Returns:
        The collated batch.

    Raises:
        ValueError: frames of different sizes at the same position; malformed
            ``normalize``/``dtype``; ``normalize`` channels not matching.
        TypeError: a position mixes frames and other types.
    """
    # Built per call so that entries installed into torch's map later (the
    # thread adapter wraps its tensor entry) are honoured.
    fn_map = dict(_torch_compat.default_collate_fn_map)
    fn_map[np.ndarray] = functools.partial(_collate_arrays, fn_map[np.ndarray])
    if normalize is None and dtype is None:
        fn_map[Frame] = _collate_frames
    else:
        transform = _transform(normalize, dtype)

        def collate_converted(frames: Any, *, collate_fn_map: Any = None) -> torch.Tensor:
            return _collate_frames(frames, transform=transform)

        fn_map[Frame] = collate_converted
    return _torch_compat.collate(batch, collate_fn_map=fn_map)
