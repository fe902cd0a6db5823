"""Which thread started each Python thread: :func:`started_within`.

The adaptive mode must know whether a loader's worker threads started threads
of their own (an executor, a prefetcher): a forked worker process would lack
them and wait on them for ever. Threads the training loop starts meanwhile
(torch.compile's workers, a logger) do not matter to the workers.

Python does not record a thread's parent, so :func:`watch` wraps
``threading.Thread.start`` once per process. The wrapper notes on the new thread
its starter and the starter's own line, weakly: a grandchild stays traced
when the child between has ended. It costs one attribute per thread start.
Threads that native code starts (an OpenCV pool) are not Python threads and
are not seen.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any, Callable, Collection

__all__ = ["started_within", "watch"]

_ATTR = "_threadloader_started_by"
_MAX_LINE = 16  # ancestors kept per thread: real lines are short
_install_lock = threading.Lock()
_original_start: Callable[[threading.Thread], None] | None = None


def watch() -> None:
    """Record, from now on, which thread starts each Python thread (idempotent)."""
    global _original_start
    with _install_lock:
        if _original_start is not None:
            return
        original = threading.Thread.start

        @functools.wraps(original)
        def start(self: threading.Thread) -> None:
            starter = threading.current_thread()
            setattr(self, _ATTR, ((weakref.ref(starter),) + _line(starter))[:_MAX_LINE])
            original(self)

        _original_start = original
        threading.Thread.start = start  # type: ignore[method-assign]


def _line(thread: threading.Thread) -> tuple[Any, ...]:
    """Weak references to the thread that started ``thread``, to the one that started that one, and so on."""
    return getattr(thread, _ATTR, ())


def started_within(roots: Collection[threading.Thread]) -> list[threading.Thread]:
    """The live threads that ``roots`` started, directly or through threads they started, since :func:`watch`."""
    return [thread for thread in threading.enumerate()
            if any(ref() in roots for ref in _line(thread))]
