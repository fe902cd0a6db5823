"""Decoded images that collate straight into one batch buffer.

A :class:`Frame` wraps decoded HWC uint8 pixels in a NumPy array; no torch
tensor is made per image. :func:`frame_collate` walks a batch exactly like
``torch.utils.data.default_collate`` and copies every frame once into a single
``(N, H, W, C)`` buffer (pinned directly when the loader pins), returning the
``(N, C, H, W)`` channels-last view: the shape, dtype and values a user gets
from ``PILToTensor`` + ``default_collate``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from . import _torch_compat
from ._context import pin_memory_requested

__all__ = ["Frame", "frame_collate"]


class Frame:
    """Decoded image pixels, height x width x channels, uint8.

    Args:
        array: ``(H, W, C)`` uint8 array (any strides). It is held, not copied.

    Raises:
        TypeError: if ``array`` is not a uint8 NumPy array.
        ValueError: if it is not 3-dimensional.
    """

    __slots__ = ("_array",)

    #: Memory layout of :meth:`numpy` (height, width, channels).
    layout = "HWC"

    def __init__(self, array: np.ndarray) -> None:
        if not isinstance(array, np.ndarray) or array.dtype != np.uint8:
            raise TypeError(f"Frame needs a uint8 numpy array, got {type(array).__name__} "
                            f"{getattr(array, 'dtype', '')}".rstrip())
        if array.ndim != 3:
            raise ValueError(f"Frame needs an (H, W, C) array, got shape {tuple(array.shape)}")
        self._array = array

    @property
    def height(self) -> int:
        return self._array.shape[0]

    @property
    def width(self) -> int:
        return self._array.shape[1]

    @property
    def channels(self) -> int:
        return self._array.shape[2]

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(height, width, channels)``."""
        return self._array.shape  # type: ignore[return-value]

    def numpy(self) -> np.ndarray:
        """The ``(H, W, C)`` uint8 pixels (the array itself, not a copy)."""
        return self._array

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if copy:
            return np.array(self._array, dtype=dtype, copy=True)
        return self._array if dtype is None else self._array.astype(dtype, copy=False)

    def to_tensor(self) -> torch.Tensor:
        """The pixels as a ``(C, H, W)`` uint8 tensor, as ``PILToTensor`` gives.

        Shares memory with the frame when its array is writable (a
        channels-last strided view), copies otherwise.
        """
        arr = self._array
        if not arr.flags.writeable:  # torch.from_numpy warns on read-only arrays
            arr = arr.copy()
        return torch.from_numpy(arr).permute(2, 0, 1)

    def __repr__(self) -> str:
        return f"Frame(height={self.height}, width={self.width}, channels={self.channels}, layout='HWC')"

    def __getstate__(self) -> np.ndarray:
        return self._array

    def __setstate__(self, state: np.ndarray) -> None:
        self._array = state


def _batch_buffer(shape: tuple[int, ...]) -> torch.Tensor:
    """An uninitialised uint8 tensor for a batch, allocated where it will end up."""
    if pin_memory_requested():
        # The loader will pin the batch: allocate it pinned, saving a copy.
        return torch.empty(shape, dtype=torch.uint8, pin_memory=True)
    info = torch.utils.data.get_worker_info()
    if info is not None and getattr(info, "worker_method", "process") != "thread":
        # Worker *process*: build the batch in shared memory, as default_collate
        # does, so sending it to the main process copies nothing.
        return _torch_compat.new_shared_uint8(shape)
    return torch.empty(shape, dtype=torch.uint8)


def _collate_frames(batch: Any, *, collate_fn_map: Any = None) -> torch.Tensor:
    first = batch[0]
    shape = first.shape
    for index, frame in enumerate(batch):
        if not isinstance(frame, Frame):
            raise TypeError(
                f"frame_collate: batch mixes Frame with {type(frame).__name__} at position {index}"
            )
        if frame.shape != shape:
            raise ValueError(
                f"frame_collate: frames in a batch must have the same size, but sample 0 is "
                f"{_size(shape)} and sample {index} is {_size(frame.shape)}. Decode to a fixed "
                f"size (decode_image(..., size=(H, W)) or RandomResizedCropLoader(size)) or add "
                f"a resize/crop transform."
            )
    out = _batch_buffer((len(batch), *shape))
    dst = out.numpy()
    for i, frame in enumerate(batch):
        # One copy per frame; numpy releases the GIL for large plain copies.
        np.copyto(dst[i], frame._array, casting="no")
    return out.permute(0, 3, 1, 2)


def _size(shape: tuple[int, ...]) -> str:
    h, w, c = shape
    return f"{h}x{w} (HxW) with {c} channels"


def frame_collate(batch: Any) -> Any:
    """Collate a batch like ``default_collate``, with frames stacked into one buffer.

    The batch is walked exactly as ``torch.utils.data.default_collate`` walks
    it (sequences, mappings, namedtuples); every non-frame leaf is collated as
    it would. Frames at one position become a ``(N, C, H, W)`` uint8 tensor,
    a channels-last view of one ``(N, H, W, C)`` buffer, allocated pinned when
    the running ThreadDataLoader pins memory.

    Args:
        batch: list of samples.

    Returns:
        The collated batch.

    Raises:
        ValueError: frames of different sizes at the same position.
        TypeError: a position mixes frames and other types.
    """
    # Built per call so that entries installed into torch's map later (the
    # thread adapter wraps its tensor entry) are honoured.
    fn_map = dict(_torch_compat.default_collate_fn_map)
    fn_map[Frame] = _collate_frames
    return _torch_compat.collate(batch, collate_fn_map=fn_map)
