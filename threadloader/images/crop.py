"""``RandomResizedCrop`` chosen from the image header, before any pixel is decoded.

:func:`random_resized_crop_params` draws torchvision's crop box from an image
size alone; :class:`RandomResizedCropLoader` uses it to decode a JPEG at the
smallest DCT scale the crop allows, and only the crop (see
:func:`~threadloader.io.decode_image`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .decode import (
    Source,
    _check_reducing_gap,
    _dct_factor,
    _decode_data,
    _edge,
    _is_jpeg,
    _pair,
    _read_source,
    _size_of,
)
from .frames import Frame

__all__ = ["random_resized_crop_params", "RandomResizedCropLoader"]

def random_resized_crop_params(
    height: int,
    width: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
    generator: torch.Generator | None = None,
) -> tuple[int, int, int, int]:
    """A ``RandomResizedCrop`` box for an image of the given size.

    The same algorithm and random draws as torchvision's
    ``RandomResizedCrop.get_params`` (with ``generator=None`` and the same
    global seed it returns the same box), but needing only the image size.

    Returns:
        ``(top, left, height, width)``.
    """
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1], generator=generator).item()
        aspect_ratio = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1], generator=generator)).item()
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, size=(1,), generator=generator).item())
            left = int(torch.randint(0, width - w + 1, size=(1,), generator=generator).item())
            return top, left, h, w
    # Fallback: central crop with the aspect ratio clamped into range.
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        h, w = height, width
    return (height - h) // 2, (width - w) // 2, h, w


def _snap(crop: tuple[int, int, int, int], f: int, height: int, width: int) -> tuple[int, int, int, int]:
    """Move a crop box's edges to multiples of ``f`` (image edges count as aligned)."""
    top, left, h, w = crop

    def snap(lo: int, hi: int, limit: int) -> tuple[int, int]:
        a = min(_edge(lo / f) * f, limit)
        b = limit if hi == limit else min(_edge(hi / f) * f, limit)
        if b - a < f:  # keep at least one scaled pixel
            b = min(a + f, limit)
            a = min(a, b - 1)
        return a, b

    t, b = snap(top, top + h, height)
    l, r = snap(left, left + w, width)
    return t, l, b - t, r - l


def _aligned(crop: tuple[int, int, int, int], f: int, height: int, width: int) -> bool:
    """Whether a crop box's edges are multiples of ``f`` (image edges count as aligned)."""
    top, left, h, w = crop
    bottom, right = top + h, left + w
    return (top % f == 0 and left % f == 0 and (bottom == height or bottom % f == 0)
            and (right == width or right % f == 0))


def _min_max(value: Any, name: str) -> tuple[float, float]:
    """``value`` as a ``(min, max)`` pair of floats, or a one-line ValueError."""
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        low = high = math.nan
    if not low <= high:  # also NaN, and what did not unpack
        raise ValueError(f"{name} must be two numbers (min, max), got {value!r}")
    return low, high


class RandomResizedCropLoader:
    """Loader doing torchvision's ``RandomResizedCrop`` while decoding.

    The crop box is drawn from the image size in the header, before decoding,
    so a JPEG can be decoded at the smallest DCT scale (1/2, 1/4, 1/8) whose
    crop is still at least ``size``; then the box is cut out and resized.
    Same pixels as full decode + crop + resize to within a few levels.

    Use it as an ``ImageFolder`` loader:
    ``ImageFolder(root, loader=RandomResizedCropLoader(224))``.

    Args:
        size: output ``(height, width)``, or an int for a square.
        scale: range of the crop area relative to the image area.
        ratio: range of the crop aspect ratio (width / height).
        generator: torch generator for the crop draws. Leave None in
            ThreadDataLoader workers: each worker thread's own generator
            (``torch.random.thread_safe_generator()``) is used then, and the
            global RNG elsewhere (as torchvision does). A generator passed here
            is shared by every thread that calls the loader.
        reducing_gap: as for :func:`decode_image`.
        fastdct: as for :func:`decode_image`.
        fastupsample: as for :func:`decode_image`.

    Raises:
        ValueError: a bad ``size`` or ``reducing_gap`` (as :func:`decode_image`),
            or ``scale``/``ratio`` not two numbers ``(min, max)``.
    """

    def __init__(
        self,
        size: int | tuple[int, int],
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
        *,
        generator: torch.Generator | None = None,
        reducing_gap: float | None = 2.0,
        fastdct: bool = False,
        fastupsample: bool = False,
    ) -> None:
        self.size = _pair(size, "size")
        self.scale = _min_max(scale, "scale")
        self.ratio = _min_max(ratio, "ratio")
        self.generator = generator
        self.reducing_gap = _check_reducing_gap(reducing_gap)
        self.fastdct = fastdct
        self.fastupsample = fastupsample

    def _generator(self) -> torch.Generator | None:
        if self.generator is not None:
            return self.generator
        thread_safe = getattr(torch.random, "thread_safe_generator", None)
        return thread_safe() if thread_safe is not None else None

    def get_params(self, height: int, width: int) -> tuple[int, int, int, int]:
        """Draw a crop box ``(top, left, height, width)`` for an image size."""
        return random_resized_crop_params(height, width, self.scale, self.ratio, self._generator())

    def __call__(self, source: Source) -> Frame:
        """Decode ``source`` (path or bytes) with a random resized crop.

        Raises:
            FileNotFoundError, OSError, ImageDecodeError, TypeError: as
                :func:`decode_image`.
        """
        return self.sample(source)[0]

    def sample(self, source: Source) -> tuple[Frame, tuple[int, int, int, int]]:
        """Like calling the loader, but also return the crop box used.

        When the JPEG is decoded at scale 1/f, the drawn box is snapped to
        multiples of f (moving each edge by < f/2 source pixels, which does
        not change the crop distribution in any way that matters) so that it
        falls exactly on scaled pixels. The result is then full decode +
        ``crop(box)`` + resize, up to the DCT-scaling filter (a few levels).

        Returns:
            ``(frame, (top, left, height, width))`` in source pixels.
        """
        data = _read_source(source)
        height, width = _size_of(data, source)
        crop = self.get_params(height, width)
        if self.reducing_gap and _is_jpeg(data):
            # Snap to the scale the decode will pick *for the snapped box*:
            # snapping can grow a box past the next scale's threshold. A box
            # on multiples of 2f is on multiples of f, so this ends.
            factor = _dct_factor(crop[2], crop[3], self.size, self.reducing_gap)
            while factor > 1 and not _aligned(crop, factor, height, width):
                crop = _snap(crop, factor, height, width)
                factor = _dct_factor(crop[2], crop[3], self.size, self.reducing_gap)
        frame = _decode_data(data, source, self.size, crop, self.reducing_gap, self.fastdct, self.fastupsample)
        return frame, crop

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(size={self.size}, scale={self.scale}, ratio={self.ratio}, "
                f"reducing_gap={self.reducing_gap})")

