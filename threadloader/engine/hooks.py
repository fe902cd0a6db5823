"""What the layers above the engine run while an iterator or a worker thread runs.

The engine knows nothing of what workers make; a layer that keeps resources
per running loader (the image path's batch buffers, :mod:`threadloader.images.buffers`)
registers a hook here when it is imported. Each hook starts something and
returns the function that ends it; the engine ends them in reverse order.

* :func:`on_iterator` hooks run when an iterator whose workers are threads of
  this process starts (``(in_flight, pinned)``: its tasks in flight, whether it pins batches);
* :func:`on_worker` hooks run in each worker thread, before its set-up
  (``(items_per_task)``: the samples one task fetches).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable

__all__ = ["Release", "on_iterator", "on_worker", "start_iterator", "start_worker"]

#: Ends what a hook started (idempotent).
Release = Callable[[], None]

_lock = threading.Lock()
# Tuples, replaced whole under the lock: a reader iterates a snapshot.
_iterator_hooks: tuple[Callable[[int, bool], Release], ...] = ()
_worker_hooks: tuple[Callable[[int], Release], ...] = ()


def on_iterator(hook: Callable[[int, bool], Release]) -> Callable[[int, bool], Release]:
    """Register ``hook(in_flight, pinned) -> release``, run as each in-process iterator starts (a decorator)."""
    global _iterator_hooks
    with _lock:
        _iterator_hooks = (*_iterator_hooks, hook)
    return hook


def on_worker(hook: Callable[[int], Release]) -> Callable[[int], Release]:
    """Register ``hook(items_per_task) -> release``, run in each worker thread as it starts (a decorator)."""
    global _worker_hooks
    with _lock:
        _worker_hooks = (*_worker_hooks, hook)
    return hook


def _run(hooks: Iterable[Callable[..., Release]], *args: Any) -> Release:
    """Start every hook in turn; returns the function that ends them, the last started first.

    A hook that raises ends those started before it, then the error propagates.
    """
    started: list[Release] = []

    def release() -> None:
        while started:
            started.pop()()

    try:
        for hook in hooks:
            started.append(hook(*args))
    except BaseException:
        release()
        raise
    return release


def start_iterator(in_flight: int, pinned: bool) -> Release:
    """Run the iterator hooks; returns the function that ends them all."""
    return _run(_iterator_hooks, in_flight, pinned)


def start_worker(items_per_task: int) -> Release:
    """Run the worker hooks in the calling worker thread; returns the function that ends them all."""
    return _run(_worker_hooks, items_per_task)
