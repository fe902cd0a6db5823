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

The conversion itself is :class:`~threadloader.images.transform.ImageTransform`'s
(also what ``frame_collate`` normalizes with).
"""

from __future__ import annotations

import collections
import copy
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from .transform import ImageTransform

__all__ = ["to_device", "DeviceLoader", "ImageTransform"]


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
                same_type = copy.copy(obj)  # a list subclass stays one
                for i, v in enumerate(mapped):
                    same_type[i] = v
                return same_type
            return type(obj)(mapped)  # type: ignore[call-arg]
        except TypeError:
            return mapped
    return obj


def _tensors(obj: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []

    def keep(t: torch.Tensor) -> torch.Tensor:
        found.append(t)
        return t

    _map_structure(obj, keep)
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
        # (host batch, copied event, done event, converted batch); an error in place of the batch: (None, None, None, it).
        inflight: collections.deque[tuple[Any, torch.cuda.Event | None, torch.cuda.Event | None, Any]] = (
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
                if copied is None or ready is None:  # the loader raised here: after the batches fetched before it
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
