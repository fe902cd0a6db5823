"""The device stage: move uint8 batches to the accelerator, then normalize there.

FFCV and DALI teach the same lesson: ship uint8 pixels (4x less traffic than
float32) and do the per-pixel float work on the device, in one fused op.
``to_device`` wraps any iterable loader and does exactly that:

* **Image rule.** Every ``torch.uint8`` tensor with 4 dimensions, anywhere in the
  batch structure (tensor, tuple/list/namedtuple, mapping), is an image batch of
  shape ``(N, C, H, W)`` — which is what ``frame_collate`` and
  ``PILToTensor`` + ``default_collate`` produce. Image batches are copied,
  converted to ``dtype``, normalized and optionally mirrored. Every other tensor
  is only moved; non-tensor leaves are left as they are.
* **Overlap.** On CUDA, the host-to-device copy and the conversion run on a side
  stream up to ``prefetch`` batches ahead of the consumer. The consumer's stream
  waits on a per-batch event before it gets the batch, and every tensor handed
  over is ``record_stream``-ed on it, so the caching allocator never reuses its
  memory early. No thread is started: streams give the overlap.
* **Buffer safety.** The host batch (often a pinned buffer that a pool wants to
  reuse) is kept referenced until an event recorded right after its copy has
  completed; only then is it released.
* **CPU fallback.** With ``device="cpu"`` the same math runs synchronously on the
  CPU, so the results (and the tests) do not need a GPU.
"""

from __future__ import annotations

import collections
import copy
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

__all__ = ["to_device", "DeviceLoader", "ImageTransform"]


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

    def _affine(self, x: torch.Tensor, out: torch.Tensor) -> None:
        """``out = x * scale + bias`` per channel."""
        n, c, h, w = x.shape
        scale, bias = self._scale_bias(x.device, c)
        if x.device.type != "cpu":
            # One kernel on the device: uint8 is promoted inside addcmul.
            torch.addcmul(bias, x, scale, out=out)
            return
        # On the CPU a mixed-dtype addcmul is not vectorized, and in channels-last
        # memory a (1, C, 1, 1) broadcast has an innermost run of only C. A
        # vectorized uint8 -> float copy, then an in-place addcmul over rows of
        # W * C values with the coefficients tiled along the row, is ~5x faster.
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
                # index_copy_ is not vectorized on the CPU; per-sample copies are ~10x faster.
                for i in flips.tolist():
                    flipped[i].copy_(x[i].flip(-1))
            else:
                flips = flips.to(x.device, non_blocking=True)
                flipped.index_copy_(0, flips, x.index_select(0, flips).flip(-1))
            x = flipped
        if self.dtype is None:
            return x.contiguous(memory_format=self.memory_format)
        out = torch.empty(x.shape, dtype=self.dtype, device=x.device, memory_format=self.memory_format)
        self._affine(x, out)
        return out


def _is_image(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.dim() == 4


def _map_structure(obj: Any, fn: Any) -> Any:
    """Apply ``fn`` to every tensor leaf; containers are rebuilt as torch's ``pin_memory`` rebuilds them.

    A ``dict`` or ``list`` subclass is copied and updated (its type and extra
    attributes kept: a ``defaultdict`` stays one); any other mapping or
    sequence is built from the mapped items (its shallow copy could share
    its storage with ``obj``), and a type that does not allow that becomes a
    dict or list. ``obj`` itself is never changed.
    """
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (str, bytes)):
        return obj
    if isinstance(obj, Mapping):
        items = {k: _map_structure(v, fn) for k, v in obj.items()}
        try:
            if isinstance(obj, dict):
                clone = copy.copy(obj)
                clone.update(items)
                return clone
            return type(obj)(items)  # type: ignore[call-arg]
        except TypeError:
            return items
    if isinstance(obj, tuple):
        mapped = [_map_structure(v, fn) for v in obj]
        if hasattr(obj, "_fields"):  # namedtuple
            return type(obj)(*mapped)
        return type(obj)(mapped)
    if isinstance(obj, Sequence):
        mapped = [_map_structure(v, fn) for v in obj]
        try:
            if isinstance(obj, list):
                clone = copy.copy(obj)
                for i, v in enumerate(mapped):
                    clone[i] = v
                return clone
            return type(obj)(mapped)  # type: ignore[call-arg]
        except TypeError:
            return mapped
    return obj


def _tensors(obj: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    _map_structure(obj, lambda t: found.append(t) or t)
    return found


class DeviceLoader:
    """Iterable returned by :func:`to_device`; see there.

    Attribute access falls through to the wrapped loader (``.dataset``,
    ``.batch_size``, ``.sampler``...), so code that inspects the loader keeps
    working.
    """

    def __init__(
        self,
        loader: Iterable[Any],
        device: torch.device,
        transform: ImageTransform,
        prefetch: int,
    ) -> None:
        self.loader = loader
        self.device = device
        self.transform = transform
        self.prefetch = prefetch

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        # Only called for names not found normally; guard against recursion
        # before __init__ has set ``loader`` (e.g. during unpickling).
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __repr__(self) -> str:
        return f"DeviceLoader({self.loader!r}, device={self.device}, prefetch={self.prefetch})"

    def __iter__(self) -> Iterator[Any]:
        if self.device.type == "cuda":
            return self._iter_cuda()
        return self._iter_sync()

    # -- synchronous path (CPU, or accelerators without stream support) ----------
    def _convert(self, batch: Any, non_blocking: bool) -> Any:
        flips_cache: dict[int, torch.Tensor | None] = {}

        def convert(t: torch.Tensor) -> torch.Tensor:
            moved = t.to(self.device, non_blocking=non_blocking)
            if not _is_image(t):
                return moved
            n = t.shape[0]
            # One flip draw per batch size: paired images (e.g. two views of the
            # same samples) are mirrored together.
            if n not in flips_cache:
                flips_cache[n] = self.transform.draw_flips(n)
            return self.transform(moved, flips_cache[n])

        return _map_structure(batch, convert)

    def _iter_sync(self) -> Iterator[Any]:
        return _SyncIter(self)

    # -- CUDA path: side stream, events, prefetch ---------------------------------
    def _iter_cuda(self) -> Iterator[Any]:
        copy_stream = torch.cuda.Stream(device=self.device)
        # Each in-flight entry: (host batch, copy-done event, ready event, device batch).
        inflight: collections.deque[tuple[Any, torch.cuda.Event, torch.cuda.Event, Any]] = (
            collections.deque()
        )
        # Host batches already handed out whose copy may still be running.
        held: list[tuple[Any, torch.cuda.Event]] = []
        source = iter(self.loader)
        exhausted = False

        def launch() -> bool:
            try:
                host = next(source)
            except StopIteration:
                return False
            except Exception as error:  # noqa: BLE001 - raised in its turn, after the batches before it
                inflight.append((None, None, None, error))
                return False
            copied = torch.cuda.Event()
            ready = torch.cuda.Event()
            with torch.cuda.stream(copy_stream):
                flips_cache: dict[int, torch.Tensor | None] = {}
                staged: list[tuple[torch.Tensor, torch.Tensor | None]] = []

                def copy(t: torch.Tensor) -> torch.Tensor:
                    dev = t.to(self.device, non_blocking=True)
                    if _is_image(t):
                        n = t.shape[0]
                        if n not in flips_cache:
                            flips_cache[n] = self.transform.draw_flips(n)
                        staged.append((dev, flips_cache[n]))
                    return dev

                moved = _map_structure(host, copy)
                copied.record(copy_stream)
                outputs = {id(dev): self.transform(dev, flips) for dev, flips in staged}
                device_batch = _map_structure(moved, lambda t: outputs.get(id(t), t))
                ready.record(copy_stream)
            inflight.append((host, copied, ready, device_batch))
            return True

        try:
            while True:
                while not exhausted and len(inflight) < self.prefetch:
                    exhausted = not launch()
                if not inflight:
                    return
                host, copied, ready, device_batch = inflight.popleft()
                if copied is None:  # the loader raised here: after the batches fetched before it
                    raise device_batch
                consumer = torch.cuda.current_stream(self.device)
                consumer.wait_event(ready)
                for t in _tensors(device_batch):
                    if t.device.type == "cuda":
                        # Allocated on the side stream, used on the consumer's.
                        t.record_stream(consumer)
                held.append((host, copied))
                # Release host batches whose copies are done; keep the rest alive.
                held = [(h, e) for h, e in held if not e.query()]
                del host
                # Refilling happens at the top of the loop, after the user's step
                # has been enqueued: the copies already in flight overlap that
                # step, and a slow loader never delays a batch that is ready.
                yield device_batch
                del device_batch
        finally:
            # Closing early (break, exception, GC): wait for copies that still
            # read host memory before dropping the last references to it.
            for _, copied, _, _ in inflight:
                if copied is not None:
                    copied.synchronize()
            for _, copied in held:
                copied.synchronize()
            inflight.clear()
            held.clear()


class _SyncIter:
    """``to_device``'s iterator without a side stream: one batch converted per ``next()``.

    A class, not a generator: an error of the wrapped loader (a worker's
    exception) is raised and the iteration goes on, as with the loader itself.
    """

    def __init__(self, owner: DeviceLoader) -> None:
        self._owner = owner
        self._source = iter(owner.loader)
        self._non_blocking = owner.device.type != "cpu"

    def __iter__(self) -> "_SyncIter":
        return self

    def __next__(self) -> Any:
        return self._owner._convert(next(self._source), self._non_blocking)


def to_device(
    loader: Iterable[Any],
    device: str | torch.device,
    *,
    normalize: tuple[Sequence[float], Sequence[float]] | None = None,
    mirror: float | None = None,
    dtype: torch.dtype | None = torch.float32,
    channels_last: bool = True,
    prefetch: int = 2,
    generator: torch.Generator | None = None,
) -> DeviceLoader:
    """Wrap ``loader`` so its batches arrive on ``device``, converted and normalized.

    Every 4-D uint8 tensor in a batch is treated as an ``(N, C, H, W)`` image
    batch: copied (``non_blocking=True``; use a loader with ``pin_memory=True``
    for truly asynchronous copies), converted to ``dtype`` with
    ``(x / 255 - mean) / std`` fused as ``x * scale + bias`` (``x / 255`` when
    ``normalize`` is None), and each sample mirrored horizontally with
    probability ``mirror``. One flip draw is shared by all image tensors of the
    same batch size in a batch. Other tensors are only moved; other leaves are
    kept. Containers (tuple, list, namedtuple, dict) keep their type.

    Args:
        loader: any iterable of batches (a DataLoader, ThreadDataLoader, list...).
        device: target device, e.g. ``"cuda"``, ``"cuda:1"`` or ``"cpu"``.
        normalize: ``(mean, std)`` in the [0, 1] pixel scale: two sequences
            with one value per channel (or a one-element sequence each, for
            all channels), or None.
        mirror: probability of a horizontal flip per sample, or None.
        dtype: floating output dtype for image batches, or None to keep uint8
            (only with ``normalize=None``).
        channels_last: return image batches in ``torch.channels_last`` format.
        prefetch: number of batches copied ahead on a side CUDA stream (>= 1;
            ignored off CUDA, where conversion is synchronous).
        generator: CPU ``torch.Generator`` for the mirror draws (None: global RNG).

    Returns:
        A :class:`DeviceLoader`: iterable, ``len()`` delegates to ``loader``.

    Raises:
        TypeError: if ``loader`` is not iterable.
        ValueError: on malformed arguments.
        RuntimeError: if ``device`` is a CUDA device and CUDA is not available.
    """
    if not isinstance(loader, Iterable):
        raise TypeError(f"loader must be iterable, got {type(loader).__name__}")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"invalid device {device!r}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r} requested but CUDA is not available")
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
        raise ValueError(f"prefetch must be an int >= 1, got {prefetch!r}")
    transform = ImageTransform(
        normalize=normalize,
        mirror=mirror,
        dtype=dtype,
        channels_last=channels_last,
        generator=generator,
    )
    return DeviceLoader(loader, dev, transform, prefetch)
