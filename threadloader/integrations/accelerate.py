"""Keep ThreadDataLoader's threads through Accelerate's ``prepare`` and ``skip_first_batches``.

Accelerate (checked with 1.15) wraps a loader by building a *new* one from its
arguments, and it builds it with the name ``DataLoader`` of
``accelerate.data_loader``, whatever the class of the loader it was given. A
ThreadDataLoader therefore comes back as a plain DataLoader: loading moves to
worker processes, and ``stats()`` and the thread loader's ``state_dict()`` are
gone, without a warning. No subclass survives that. So these helpers run
Accelerate's own code with that name pointing at a builder of
:class:`ThreadDataLoader` (which also carries ``worker_processes``). The name
points there for the duration of the call, and only when the loader being
prepared is one::

    from threadloader.integrations import accelerate as tl_accelerate

    model, optimizer = accelerator.prepare(model, optimizer)
    loader = tl_accelerate.prepare_data_loader(accelerator, loader)
    # or, for everything at once:
    model, optimizer, loader = tl_accelerate.prepare(accelerator, model, optimizer, loader)
    # on resume:
    skipped = tl_accelerate.skip_first_batches(accelerator, loader, num_batches=k)

The prepared object is Accelerate's own wrapper (device placement, sharding,
``set_epoch``, ``end_of_dataloader``), with a ThreadDataLoader inside:
``isinstance(prepared, ThreadDataLoader)`` holds and ``prepared.stats()``
reaches the thread loader. Plain DataLoaders passed to :func:`prepare` are
prepared exactly as Accelerate prepares them.

The name is swapped under a lock and restored afterwards; preparing is a
set-up step, so nothing else is expected to build Accelerate loaders in
another thread at that moment.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

from .._platform.fork import renew_after_fork
from ..loader import ThreadDataLoader

__all__ = ["prepare", "prepare_data_loader", "skip_first_batches"]

_swap_lock = threading.Lock()
renew_after_fork(__name__, "_swap_lock")


def _is_thread_loader(loader: Any) -> bool:
    # A prepared loader reports its inner loader's class (Accelerate's
    # wrappers override __class__), so this also sees through them.
    return isinstance(loader, ThreadDataLoader)


def _inner(loader: Any) -> Any:
    """The ThreadDataLoader itself, inside an Accelerate wrapper or not."""
    return getattr(loader, "base_dataloader", loader)


@contextlib.contextmanager
def _accelerate_builds_thread_loaders(loader: Any) -> Iterator[None]:
    import accelerate.data_loader as adl

    worker_processes = getattr(_inner(loader), "worker_processes", 0)

    def build(*args: Any, **kwargs: Any) -> ThreadDataLoader:
        # Accelerate passes on DataLoader's own arguments only: ThreadDataLoader's
        # keyword-only extras are bound here. (Its module uses the name only to
        # construct loaders, so a function can stand in for the class.)
        built = ThreadDataLoader(*args, worker_processes=worker_processes, **kwargs)
        # Accelerate reads the loader's state_dict() as it wraps it and before
        # every batch, to keep it for a later save_state: a checkpoint that
        # cannot be taken (a sampler's state_dict() raised) must not stop
        # training; loading that state raises instead.
        built._defer_checkpoint_errors = True
        return built

    with _swap_lock:
        saved = adl.DataLoader
        adl.DataLoader = build
        try:
            yield
        finally:
            adl.DataLoader = saved


def prepare_data_loader(accelerator: Any, loader: Any, **kwargs: Any) -> Any:
    """``accelerator.prepare_data_loader(loader, **kwargs)``, keeping a ThreadDataLoader.

    Args:
        accelerator: an ``accelerate.Accelerator``.
        loader: the loader to prepare (anything else is passed through to Accelerate).
        **kwargs: ``device_placement``, ``slice_fn_for_dispatch`` as Accelerate takes them.

    Returns:
        Accelerate's prepared loader; with a ThreadDataLoader inside when one was given.
    """
    if not _is_thread_loader(loader):
        return accelerator.prepare_data_loader(loader, **kwargs)
    with _accelerate_builds_thread_loaders(loader):
        return accelerator.prepare_data_loader(loader, **kwargs)


def skip_first_batches(accelerator: Any, loader: Any, num_batches: int = 0) -> Any:
    """``accelerator.skip_first_batches(loader, num_batches)``, keeping a ThreadDataLoader.

    Returns:
        A loader that skips the first ``num_batches`` batches (Accelerate's).
    """
    if not _is_thread_loader(loader):
        return accelerator.skip_first_batches(loader, num_batches)
    with _accelerate_builds_thread_loaders(loader):
        return accelerator.skip_first_batches(loader, num_batches)


def prepare(accelerator: Any, *args: Any, device_placement: list[bool] | None = None) -> Any:
    """``accelerator.prepare(*args)``, keeping every ThreadDataLoader among ``args``.

    Thread loaders are prepared first (with :func:`prepare_data_loader`) and
    marked prepared, so Accelerate's ``prepare`` registers them and passes them
    through; everything else is prepared by Accelerate as usual, in one call.

    Returns:
        What ``accelerator.prepare`` returns (one object, or a tuple in order).
    """
    if device_placement is not None and len(device_placement) != len(args):
        raise ValueError(
            f"`device_placement` should be a list with {len(args)} elements (the number of objects passed)."
        )
    items = list(args)
    for i, obj in enumerate(items):
        if _is_thread_loader(obj) and not getattr(obj, "_is_accelerate_prepared", False):
            placement = None if device_placement is None else device_placement[i]
            items[i] = prepare_data_loader(accelerator, obj, device_placement=placement)
            items[i]._is_accelerate_prepared = True
    return accelerator.prepare(*items, device_placement=device_placement)
