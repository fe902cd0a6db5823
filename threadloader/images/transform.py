"""The uint8 -> float conversion of image batches: :class:`ImageTransform`.

One fused ``x * scale + bias`` per channel (normalization included), with
optional per-sample mirroring. ``to_device`` runs it on the accelerator
(:mod:`.device`); ``frame_collate`` runs it in the worker, into the batch
(:mod:`.frames`): the results are bit-identical whichever stage normalizes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ["ImageTransform"]

#: Widths whose tiled coefficient rows an ImageTransform keeps (see ImageTransform._tiled).
_ROWS_KEPT = 16


class ImageTransform:
    """Fused uint8 -> float conversion, normalization and per-sample mirroring.

    ``y = x * scale + bias`` with ``scale = 1 / (255 * std)`` and
    ``bias = -mean / std`` equals ``(x / 255 - mean) / std`` (torchvision's
    ``Normalize`` after ``ToDtype(scale=True)``); without ``normalize`` it is
    ``x / 255``. Mirroring flips a random subset of samples along the width.

    Args:
        normalize: ``(mean, std)`` per-channel sequences (same length, std > 0),
            or None.
        mirror: probability in [0, 1] of flipping each sample horizontally, or
            None for no mirroring.
        dtype: floating output dtype, or None to keep uint8 (then ``normalize``
            must be None).
        channels_last: whether outputs use ``torch.channels_last`` memory format
            (else contiguous).
        generator: CPU ``torch.Generator`` for the mirror draws (None: the global
            RNG). Draws happen on the CPU, so CPU and CUDA results agree.

    Raises:
        ValueError: on malformed ``normalize``/``mirror``/``dtype``.
    """

    def __init__(
        self,
        normalize: tuple[Sequence[float], Sequence[float]] | None = None,
        mirror: float | None = None,
        dtype: torch.dtype | None = torch.float32,
        channels_last: bool = True,
        generator: torch.Generator | None = None,
    ) -> None:
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise ValueError(f"dtype must be a floating torch.dtype or None, got {dtype!r}")
        if normalize is not None:
            if dtype is None:
                raise ValueError("normalize needs a floating dtype, got dtype=None")
            try:
                mean, std = normalize
                mean = [float(m) for m in mean]
                std = [float(s) for s in std]
            except (TypeError, ValueError) as exc:
                raise ValueError(
                    f"normalize must be (mean, std) sequences of numbers, got {normalize!r}"
                ) from exc
            if not mean or len(mean) != len(std):
                raise ValueError(
                    f"normalize mean and std must be non-empty and of equal length, got "
                    f"{len(mean)} and {len(std)}"
                )
            if not all(math.isfinite(s) and s > 0 for s in std) or not all(
                math.isfinite(m) for m in mean
            ):
                raise ValueError(f"normalize needs finite mean and std > 0, got {normalize!r}")
            self.mean: list[float] | None = mean
            self.std: list[float] | None = std
        else:
            self.mean = self.std = None
        if mirror is not None:
            if isinstance(mirror, bool) or not isinstance(mirror, (int, float)):
                raise ValueError(f"mirror must be a probability in [0, 1] or None, got {mirror!r}")
            if not 0.0 <= float(mirror) <= 1.0:
                raise ValueError(f"mirror must be a probability in [0, 1], got {mirror!r}")
            mirror = float(mirror)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError(f"generator must be a torch.Generator or None, got {generator!r}")
        if generator is not None and generator.device.type != "cpu":
            raise ValueError("generator must be a CPU torch.Generator")
        self.mirror = mirror
        self.dtype = dtype
        self.channels_last = channels_last
        self.generator = generator
        # scale/bias per (device, channels): computed once, reused every batch.
        self._coeffs: dict[tuple[torch.device, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._rows: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def memory_format(self) -> torch.memory_format:
        return torch.channels_last if self.channels_last else torch.contiguous_format

    def draw_flips(self, n: int) -> torch.Tensor | None:
        """Indices (CPU int64) of the samples to mirror in a batch of ``n``.

        Drawn on the CPU at dispatch time, in batch order, so a seeded
        generator gives the same flips on every device.
        """
        if not self.mirror:
            return None
        mask = torch.rand(n, generator=self.generator) < self.mirror
        return mask.nonzero().flatten()

    def _scale_bias(self, device: torch.device, channels: int) -> tuple[torch.Tensor, torch.Tensor]:
        key = (device, channels)
        coeffs = self._coeffs.get(key)
        if coeffs is None:
            if self.mean is not None:
                if len(self.mean) not in (1, channels):
                    raise ValueError(
                        f"normalize has {len(self.mean)} channels but the image batch has {channels}"
                    )
                mean = torch.tensor(self.mean, dtype=torch.float64)
                std = torch.tensor(self.std, dtype=torch.float64)
            else:
                mean, std = torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
            # float64 on the host so the fused form loses nothing before the cast.
            scale = (1.0 / (255.0 * std)).to(self.dtype).view(1, -1, 1, 1).to(device)
            bias = (-mean / std).to(self.dtype).view(1, -1, 1, 1).to(device)
            coeffs = self._coeffs[key] = (scale, bias)
        return coeffs

    def normalize_into(self, x: torch.Tensor, out: torch.Tensor) -> None:
        """Write ``x * scale + bias`` per channel into ``out``: the conversion without mirroring.

        Args:
            x: a ``(N, C, H, W)`` uint8 batch.
            out: a tensor of :attr:`dtype` and ``x``'s shape, on ``x``'s device (any memory format).
        """
        n, c, h, w = x.shape
        scale, bias = self._scale_bias(x.device, c)
        if x.device.type != "cpu":
            # One kernel on the device: uint8 is promoted inside addcmul.
            torch.addcmul(bias, x, scale, out=out)
            return
        # On the CPU a mixed-dtype addcmul is not vectorized, and in channels-last
        # memory a (1, C, 1, 1) broadcast has an innermost run of only C. A
        # vectorized uint8 -> float copy, then an in-place addcmul over rows of
        # W * C values with the coefficients tiled along the row, is much faster.
        out.copy_(x)
        if out.is_contiguous(memory_format=torch.channels_last) and c > 1 and n * h * w > 0:
            rows = out.permute(0, 2, 3, 1).view(n * h, w * c)
            scale_row, bias_row = self._tiled(scale, bias, w)
            torch.addcmul(bias_row, rows, scale_row, out=rows)
        else:
            torch.addcmul(bias, out, scale, out=out)

    def _tiled(self, scale: torch.Tensor, bias: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        # (1, C, 1, 1) coefficients repeated along one NHWC row of W * C values;
        # a single coefficient (1, 1, 1, 1) broadcasts as it is.
        key = (scale.shape[1], width)
        tiled = self._rows.get(key)
        if tiled is None:
            reps = width if scale.shape[1] > 1 else 1
            tiled = (scale.flatten().repeat(reps), bias.flatten().repeat(reps))
            if len(self._rows) >= _ROWS_KEPT:
                # A cache, bounded: images at their native widths would add a
                # row per width for as long as the transform lives.
                self._rows.clear()
            self._rows[key] = tiled
        return tiled

    def __call__(self, x: torch.Tensor, flips: torch.Tensor | None = None) -> torch.Tensor:
        """Convert one ``(N, C, H, W)`` uint8 batch; never modifies ``x``.

        Args:
            x: uint8 image batch on the target device.
            flips: indices of samples to mirror (from :meth:`draw_flips`), or None.

        Returns:
            A new tensor of ``dtype`` (or uint8 when ``dtype`` is None), in the
            requested memory format, on ``x.device``.

        Raises:
            ValueError: if ``x`` is not a 4-D uint8 tensor or its channels do
                not match ``normalize``.
        """
        if x.dtype != torch.uint8 or x.dim() != 4:
            raise ValueError(f"expected a (N, C, H, W) uint8 tensor, got {x.dtype} {tuple(x.shape)}")
        if flips is not None and flips.numel():
            # Mirror the uint8 pixels before conversion: 4x fewer bytes than
            # flipping floats. Index lists (not boolean masks) avoid a
            # device-to-host sync on CUDA. Works on a copy: x is never modified.
            flipped = x.clone()
            if x.device.type == "cpu":
                # index_copy_ is not vectorized on the CPU; per-sample copies are much faster.
                for i in flips.tolist():
                    flipped[i].copy_(x[i].flip(-1))
            else:
                flips = flips.to(x.device, non_blocking=True)
                flipped.index_copy_(0, flips, x.index_select(0, flips).flip(-1))
            x = flipped
        if self.dtype is None:
            return x.contiguous(memory_format=self.memory_format)
        out = torch.empty(x.shape, dtype=self.dtype, device=x.device, memory_format=self.memory_format)
        self.normalize_into(x, out)
        return out
