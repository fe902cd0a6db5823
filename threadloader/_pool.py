"""Reusable host memory for batch buffers, handed back only once nobody uses it.

A batch buffer is lent as a tensor made by ``torch.from_numpy`` over a *fresh*
NumPy array object viewing a pooled block. torch's storage keeps that array
object alive for as long as any tensor, view, slice or ``.numpy()`` of the
batch exists, so a weak reference to it tells, exactly, when the consumer has
let go of everything: its callback returns the block to the free list. Nothing
is reused earlier, whatever the user keeps.

* Thread-safe by construction: one (reentrant) lock around the free list and
  the loans;
  the weakref callback may run in any thread.
* Bounded: the free list keeps at most ``slack`` blocks (the oldest go back
  to the allocator); everything else is in use by someone.
* Pinned memory is not pooled here: torch's caching host allocator already
  reuses pinned blocks, and only once every copy that read them has completed
  (it records events on non-blocking copies), which a pool of ours could not
  see. Shared memory for worker processes is not pooled either: the receiving
  process keeps using it after this one lets go.
"""

from __future__ import annotations

import os
import threading
import weakref

import numpy as np
import torch

__all__ = ["BufferPool", "host_pool"]


class BufferPool:
    """Free list of host memory blocks, lent as tensors and returned on release.

    Args:
        slack: most blocks kept unused (per pool, all sizes together).

    Raises:
        ValueError: ``slack`` < 0.
    """

    def __init__(self, slack: int = 4) -> None:
        if slack < 0:
            raise ValueError(f"slack must be >= 0, got {slack}")
        self.slack = slack
        # Reentrant: the weakref callback can run inside take() itself, when
        # an allocation there triggers a garbage collection that frees a batch.
        self._lock = threading.RLock()
        self._free: list[tuple[int, np.ndarray]] = []  # (nbytes, block), oldest first
        # id(weak reference) -> (the reference, nbytes, block); the dict keeps
        # each reference alive (so its callback runs) and its id unique.
        self._lent: dict[int, tuple[weakref.ref, int, np.ndarray]] = {}

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised contiguous CPU tensor of ``shape`` and ``dtype``.

        Its memory returns to the pool when the last tensor or array using it
        is gone; it is never handed out again before.
        """
        nbytes = dtype.itemsize
        for d in shape:
            nbytes *= d
        block = None
        with self._lock:
            free = self._free
            for i in range(len(free) - 1, -1, -1):  # newest first: warmest in cache
                if free[i][0] == nbytes:
                    block = free.pop(i)[1]
                    break
        if block is None:
            block = np.empty(max(nbytes, 1), dtype=np.uint8)
        # A new array object per loan: the weak reference watches this one,
        # which torch's storage holds until every user of the batch is gone.
        lent = block[:nbytes]
        ref = weakref.ref(lent, self._give_back)
        with self._lock:
            self._lent[id(ref)] = (ref, nbytes, block)
        return torch.from_numpy(lent).view(dtype).view(shape)

    def _give_back(self, ref: weakref.ref) -> None:
        with self._lock:
            entry = self._lent.pop(id(ref), None)
            if entry is None:  # lent before a fork, by the parent
                return
            self._free.append(entry[1:])
            if len(self._free) > self.slack:
                del self._free[0]

    def stats(self) -> dict[str, int]:
        """``{"lent": blocks in use, "free": blocks kept, "free_bytes": their size}``."""
        with self._lock:
            free = list(self._free)
            return {"lent": len(self._lent), "free": len(free), "free_bytes": sum(n for n, _ in free)}

    def clear(self) -> None:
        """Drop the free blocks (blocks in use are unaffected)."""
        with self._lock:
            self._free.clear()

    def _after_fork(self) -> None:
        # A forked child starts with one thread: a lock held by another parent
        # thread at fork time would never be released there.
        self._lock = threading.RLock()
        self._free = []
        self._lent = {}


#: The process's pool for non-pinned batch buffers (frame_collate's).
host_pool = BufferPool()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=host_pool._after_fork)
