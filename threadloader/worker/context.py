"""Per-thread facts the engine hands to collate functions.

A collate function cannot see the loader that calls it. ``frame_collate`` needs
to know whether the loader pins its batches, so that it can allocate the batch
buffer pinned directly instead of pinning a copy afterwards. Each worker thread
collates for one loader only, so the engine sets this once per worker, in a
context variable (a worker run in the consumer's thread has its own context);
nothing here is global.
"""

from __future__ import annotations

import contextvars
from typing import Any

_PIN: contextvars.ContextVar[bool] = contextvars.ContextVar("threadloader_collating_pinned", default=False)
#: This module's context variables: a worker sets its own, never inherits them.
CONTEXT_VARS = frozenset({_PIN})


def pin_memory_requested() -> bool:
    """Whether the loader running this collate call pins its batches.

    Returns:
        True only inside a ThreadDataLoader worker thread whose loader has
        ``pin_memory=True`` *and* an accelerator exists; False elsewhere.
    """
    return _PIN.get()


def set_collating(pin: bool) -> None:
    """Set, for the calling thread, whether the batches it collates get pinned.

    Args:
        pin: whether results will be pinned (so may be allocated pinned, for
            the current accelerator, which is the one DataLoader pins for).
    """
    _PIN.set(pin)


# Set once in a threadloader worker process (worker_processes > 0), never
# cleared: the whole process serves one loader.
_arena: Any = None


def batches_cross_processes() -> bool:
    """Whether batches made here travel to another process.

    Returns:
        True in a threadloader worker *process* (``worker_processes > 0``):
        collate functions should then build batches in shared memory, as in
        DataLoader's worker processes, so that sending them copies nothing.
        False elsewhere (worker threads of the consumer's process share its
        memory).
    """
    return _arena is not None


def child_arena() -> Any:
    """The shared-memory batch buffers of this worker process (a ``ChildArena``); None elsewhere."""
    return _arena


def mark_child_process(arena: Any) -> None:
    """Record that this process is a threadloader worker process (called once, in the child).

    Args:
        arena: its ``threadloader.procs.arena.ChildArena``, where batches
            for the loader's process are built.
    """
    global _arena
    _arena = arena
