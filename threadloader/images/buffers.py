"""Reusable host memory for batch buffers, handed back only once nobody uses it.

A batch buffer is lent as a tensor made by ``torch.from_numpy`` over an array
built on a *fresh* memoryview of a pooled block. torch's storage and every
NumPy view keep that memoryview alive for as long as any tensor, view, slice
or ``.numpy()`` of the batch exists, so a weak reference to it tells, exactly,
when the consumer has let go of everything: its callback returns the block to
the free list. Nothing is reused earlier, whatever the user keeps.

* Thread-safe by construction: one (reentrant) lock around the free list and
  the loans;
  the weakref callback may run in any thread.
* Bounded: the free list keeps at most ``slack`` blocks, plus what running
  loaders have reserved (the oldest go back to the allocator); everything
  else is in use by someone. A free block no request has matched for a
  while (:meth:`BufferPool._idle_limit` loans) goes back too: one odd size
  (a panorama, a huge image) must not stay for ever beside the working set.
  A loader reserves its in-flight depth while it runs: blocks handed back at
  an epoch's end or in a burst are then reused instead of being freed and
  faulted in again (with many worker threads, page faults in one address
  space serialise), and the reservation ends with the loader, so idle
  memory falls back to ``slack`` blocks.
* Pinned memory is not pooled here: torch's caching host allocator already
  reuses pinned blocks, and only once every copy that read them has completed
  (it records events on non-blocking copies), which a pool of ours could not
  see. Shared memory for ``worker_processes`` children is pooled by
  :class:`threadloader.procs.arena.ChildArena`, this pool with one more
  holder per block: the loader's process.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Callable

import numpy as np
import torch

from ..engine import hooks

__all__ = ["BufferPool", "decode_pool", "host_pool", "nbytes_of"]


class BufferPool:
    """Free list of host memory blocks, lent as tensors or arrays and returned on release.

    Args:
        slack: most blocks kept unused (per pool, all sizes together).
        granule: block sizes are rounded up to a multiple of this many bytes,
            so that requests of nearby sizes (decoded images of varying
            dimensions) reuse the same blocks; 1 matches sizes exactly.

    Raises:
        ValueError: ``slack`` < 0 or ``granule`` < 1.
    """

    def __init__(self, slack: int = 4, granule: int = 1) -> None:
        if slack < 0:
            raise ValueError(f"slack must be >= 0, got {slack}")
        if granule < 1:
            raise ValueError(f"granule must be >= 1, got {granule}")
        self.slack = slack
        self.granule = granule
        self._reserved = 0  # extra free blocks kept for running loaders (see reserve)
        # Reentrant: the weakref callback can run inside take() itself, when
        # an allocation there triggers a garbage collection that frees a batch.
        self._lock = threading.RLock()
        self._free: list[tuple[int, np.ndarray, int]] = []  # (nbytes, block, loans when freed), oldest first
        self._loans = 0  # loans made so far (the free blocks' clock)
        # id(weak reference) -> (the reference, nbytes, block); the dict keeps
        # each reference alive (so its callback runs) and its id unique.
        self._lent: dict[int, tuple[weakref.ref, int, np.ndarray]] = {}

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised contiguous CPU tensor of ``shape`` and ``dtype``.

        Its memory returns to the pool when the last tensor or array using it
        is gone; it is never handed out again before.
        """
        return torch.from_numpy(self.take_bytes(nbytes_of(shape, dtype))).view(dtype).view(shape)

    def take_bytes(self, nbytes: int) -> np.ndarray:
        """An uninitialised 1-D uint8 array of ``nbytes``, lent like :meth:`take`.

        The block returns to the pool when this array object and everything
        built on it (views, tensors, arrays decoded into it) are gone.
        """
        capacity = self.capacity(nbytes)
        # One lock round for the whole loan: this runs once per decoded image.
        with self._lock:
            block = None
            free = self._free
            for i in range(len(free) - 1, -1, -1):  # newest first: warmest in cache
                if free[i][0] == capacity:
                    block = free.pop(i)[1]
                    break
            self._loans += 1
            if free and self._loans - free[0][2] > self._idle_limit():
                self._drop(1)  # the oldest, unmatched all that time: not part of the working set
            if block is None:
                block = self._new_block(capacity)
            # A new memoryview per loan: the weak reference watches it. Every
            # array made from this one, and torch's storage of a tensor made
            # from it, holds this memoryview as its base (numpy collapses a
            # view's base to the first object that is not a view-array). So it
            # dies only when all of them are gone.
            lent = np.frombuffer(memoryview(block)[:nbytes], dtype=np.uint8)
            ref = weakref.ref(lent.base, self._give_back)  # numpy's own memoryview of it
            self._lent[id(ref)] = (ref, capacity, block)
        return lent

    def capacity(self, nbytes: int) -> int:
        """The size of the block lent for ``nbytes`` (rounded up to the granule)."""
        return max(-(-nbytes // self.granule) * self.granule, 1)

    def _give_back(self, ref: weakref.ref) -> None:
        with self._lock:
            entry = self._lent.pop(id(ref), None)
            if entry is None:  # lent before a fork, by the parent
                return
            if self._reusable(entry[2]):
                self._put_back(entry[1], entry[2])

    # Hooks for pools whose blocks are also held outside this process (see
    # threadloader.procs.arena); each runs with the lock held.

    def _new_block(self, capacity: int) -> np.ndarray:
        """A new block: a 1-D uint8 array of ``capacity`` bytes."""
        return np.empty(capacity, dtype=np.uint8)

    def _reusable(self, block: np.ndarray) -> bool:
        """Whether ``block``, let go of by everything here, may be lent again now.

        A pool saying no puts it back itself (:meth:`_put_back`) once whoever
        else holds it has let go.
        """
        return True

    def _forget(self, block: np.ndarray) -> None:
        """``block`` leaves the pool for good."""

    def _put_back(self, capacity: int, block: np.ndarray) -> None:
        """Add a block nobody uses to the free list (newest last), within the limit."""
        self._free.append((capacity, block, self._loans))
        if len(self._free) > self.slack + self._reserved:
            self._drop(1)

    def _drop(self, count: int) -> None:
        """Let the ``count`` oldest free blocks go."""
        dropped = self._free[:count]
        del self._free[:count]
        for entry in dropped:
            self._forget(entry[1])

    def _idle_limit(self) -> int:
        """Loans after which a free block nobody asked for is let go (caller holds the lock).

        A working set of blocks, as many as the pool keeps, comes round within
        a few times that many loans.
        """
        return 4 * (self.slack + self._reserved) + 64

    def reserve(self, blocks: int) -> Callable[[], None]:
        """Keep up to ``blocks`` more free blocks until the returned function is called.

        A loader reserves its in-flight depth for as long as it runs: its
        working set then stays in the pool across bursts and epochs.

        Args:
            blocks: how many more free blocks to keep (>= 0).

        Returns:
            ``release()``: ends the reservation (idempotent) and frees the
            blocks now beyond the limit, oldest first.

        Raises:
            ValueError: ``blocks`` < 0.
        """
        if blocks < 0:
            raise ValueError(f"blocks must be >= 0, got {blocks}")
        with self._lock:
            self._reserved += blocks
        released = [False]

        def release() -> None:
            with self._lock:
                if released[0]:
                    return
                released[0] = True
                self._reserved -= blocks
                excess = len(self._free) - (self.slack + self._reserved)
                if excess > 0:
                    self._drop(excess)

        return release

    def stats(self) -> dict[str, int]:
        """``{"lent": blocks in use, "free": blocks kept, "free_bytes": their size, "reserved": extra blocks kept}``."""
        with self._lock:
            free = list(self._free)
            return {"lent": len(self._lent), "free": len(free), "free_bytes": sum(e[0] for e in free),
                    "reserved": self._reserved}

    def clear(self) -> None:
        """Drop the free blocks (blocks in use are unaffected)."""
        with self._lock:
            self._drop(len(self._free))

    def _after_fork(self) -> None:
        # A forked child starts with one thread: a lock held by another parent
        # thread at fork time would never be released there.
        self._lock = threading.RLock()
        self._free = []
        self._lent = {}
        self._reserved = 0  # the parent's loaders do not run here


def nbytes_of(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    """Bytes of a contiguous tensor of ``shape`` and ``dtype``."""
    nbytes = dtype.itemsize
    for d in shape:
        nbytes *= d
    return nbytes


#: The process's pool for non-pinned batch buffers (frame_collate's).
host_pool = BufferPool()

#: The process's pool for decoded JPEG pixels (decode_image's). Fresh memory
#: for every decoded image costs page faults. In one process, many threads
#: faulting and unmapping memory serialise on the kernel's address-space lock.
#: Blocks are rounded to 64 KiB so that images of different sizes share them.
#: A batch's frames are all held until collate, so a running loader reserves
#: its threads' share (see ``BufferPool.reserve``). The base slack is one
#: batch's worth, for decode_image called outside a loader.
decode_pool = BufferPool(slack=32, granule=64 << 10)

if hasattr(os, "register_at_fork"):
    for _pool in (host_pool, decode_pool):
        os.register_at_fork(after_in_child=_pool._after_fork)


@hooks.on_iterator
def _reserve_in_flight(in_flight: int, pinned: bool) -> hooks.Release:
    """Keep a running loader's in-flight working set in the pools; returns the release.

    frame_collate's batch buffers live until the training loop drops them
    (the in-flight depth, plus the batch it holds; pinned batches are not
    pooled); unbatched frames until it reads them. Freed and faulted in
    again, they would cost page faults, which serialise many threads.
    """
    releases = [decode_pool.reserve(in_flight)]
    if not pinned:
        releases.append(host_pool.reserve(in_flight + 1))

    def release() -> None:
        for r in releases:
            r()

    return release


@hooks.on_worker
def _reserve_task_frames(items_per_task: int) -> hooks.Release:
    """Room in the decode pool for one task's frames (they all live until collate), while a worker thread runs."""
    return decode_pool.reserve(items_per_task)
