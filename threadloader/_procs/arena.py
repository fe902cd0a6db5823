"""Batch buffers in shared memory that a ``worker_processes`` child reuses once the loader's process lets go.

Without it a child builds every batch in fresh shared memory (as DataLoader's
workers do): each batch costs a new segment, a file descriptor passed to the
parent, a mapping there, and a page fault per 4 KiB page on both sides (150
per 224x224 float image), and in one process many threads faulting and
unmapping serialise on the kernel's address-space lock.

Here each child keeps an arena (:class:`ChildArena`): shared-memory blocks,
lent for batch buffers (``frame_collate``'s, and ``default_collate``'s
through :mod:`threadloader._torch_compat`) exactly as
:class:`threadloader._pool.BufferPool` lends host memory. A block reaches the
parent once, as torch shares any storage; the parent keeps it mapped
(:class:`Mirror`), and afterwards a batch in it travels as its block's id.
The parent lends the consumer a tensor over its mapping and watches it as the
pool watches its loans: when the last tensor, view or array of that batch is
gone, the block's id goes back to the child with its next job, and the
child lends the block again only then, and only once its own references are
gone too. Nothing is overwritten while anyone can still read it.

Only plain CPU tensors whose memory is an arena block travel by id (the
reducer checks); everything else goes through torch's reductions as before.
Past :attr:`ChildArena.max_blocks` blocks in use (a training loop keeping its
batches), new batches get fresh shared memory, as DataLoader's do.
"""

from __future__ import annotations

import collections
import io
import itertools
import os
import threading
import weakref
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch

from .. import _torch_compat
from .._pool import BufferPool, nbytes_of

__all__ = ["ChildArena", "Mirror", "mirror_count"]

#: Blocks are rounded up to this many bytes: batches of nearby sizes share them.
GRANULE = 64 << 10


@dataclass(eq=False)
class _Block:
    """A child's shared-memory block and who holds it."""

    id: int
    storage: torch.UntypedStorage
    array: np.ndarray  # uint8, over ``storage``: what the pool lends
    capacity: int
    #: Batches in this block the parent has been sent and not yet let go of.
    parent_loans: int = 0
    #: The parent maps it already (sent once): later batches name it by id.
    sent: bool = False
    #: Let go of in this process while the parent still held it.
    parked: bool = False


class ChildArena(BufferPool):
    """A child process's pool of shared-memory batch buffers (see the module docstring).

    Args:
        token: the parent's :class:`Mirror` for this child.
        batches: the child's batches in circulation (in flight, held by the
            consumer, being pinned). The free blocks kept are that many times
            the most arena tensors one result has held so far (a batch of
            images and labels is two).
    """

    def __init__(self, token: str, batches: int) -> None:
        super().__init__(slack=batches, granule=GRANULE)
        self.token = token
        self._batches = batches
        self._per_result = 1
        #: Most blocks at once. Each holds a file descriptor here and one in the
        #: parent: a training loop that keeps its batches gets fresh shared
        #: memory past this, as from DataLoader's workers, whose descriptors
        #: close once sent (the parent's limit, not the child's, runs out first).
        self.max_blocks = 2 * batches + 8
        self._by_id: dict[int, _Block] = {}
        self._by_addr: dict[int, _Block] = {}
        self._ids = itertools.count()
        #: Ids of blocks this child let go of that the parent maps: it unmaps
        #: them when it reads them (with the next batch sent by id).
        self._forgotten: list[int] = []

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A batch buffer: an arena block, or fresh shared memory when :attr:`max_blocks` are all in use."""
        nbytes = nbytes_of(shape, dtype)
        capacity = self.capacity(nbytes)
        with self._lock:
            if len(self._by_id) < self.max_blocks or any(e[0] == capacity for e in self._free):
                return super().take(shape, dtype)
        return _torch_compat.new_shared_uint8((nbytes,)).view(dtype).view(shape)

    def _new_block(self, capacity: int) -> np.ndarray:
        tensor = _torch_compat.new_shared_uint8((capacity,))
        block = _Block(next(self._ids), tensor.untyped_storage(), tensor.numpy(), capacity)
        self._by_id[block.id] = block
        self._by_addr[tensor.data_ptr()] = block
        return block.array

    def _state(self, array: np.ndarray) -> _Block:
        return self._by_addr[array.__array_interface__["data"][0]]

    def _reusable(self, array: np.ndarray) -> bool:
        block = self._state(array)
        if block.parent_loans:
            block.parked = True  # put back by parent_released
            return False
        return True

    def _forget(self, array: np.ndarray) -> None:
        block = self._state(array)
        del self._by_addr[array.__array_interface__["data"][0]], self._by_id[block.id]
        if block.sent:
            self._forgotten.append(block.id)

    def parent_released(self, ids: tuple[int, ...]) -> None:
        """The parent let go of one batch in each of these blocks (ids repeat for several)."""
        with self._lock:
            for i in ids:
                block = self._by_id.get(i)
                if block is not None and block.parent_loans > 0:  # (a parent never frees twice)
                    self._end_parent_loan(block)

    def _end_parent_loan(self, block: _Block) -> None:
        # Caller holds the lock.
        block.parent_loans -= 1
        if block.parent_loans == 0 and block.parked:
            block.parked = False
            self._put_back(block.capacity, block.array)

    def reduce(self, tensor: torch.Tensor) -> tuple[Any, tuple[Any, ...]] | None:
        """How ``tensor`` travels by block id, or None when it is not a batch in this arena.

        Counts a parent loan of its block (undone by :meth:`unsend` if the
        message is not sent after all).
        """
        if (tensor.device.type != "cpu" or tensor.requires_grad or tensor.is_conj() or tensor.is_neg()
                or tensor.layout != torch.strided):
            return None
        storage = tensor.untyped_storage()
        with self._lock:
            block = self._by_addr.get(storage.data_ptr())
            if block is None or storage.nbytes() > block.capacity:
                return None
            block.parent_loans += 1
            first = None if block.sent else block.storage
            block.sent = True
            forget, self._forgotten = tuple(self._forgotten), []
        args = (self.token, block.id, first, forget, storage.nbytes(), tensor.dtype,
                tensor.storage_offset(), tuple(tensor.size()), tuple(tensor.stride()))
        return _lend, args

    def unsend(self, reductions: list[tuple[Any, ...]]) -> None:
        """Undo :meth:`reduce` for messages that failed to pickle (nothing of them reached the parent)."""
        with self._lock:
            for args in reductions:
                block = self._by_id.get(args[1])
                if block is None:  # pragma: no cover - a block the parent holds is never dropped
                    continue
                if args[2] is not None:
                    block.sent = False
                self._forgotten.extend(args[3])
                self._end_parent_loan(block)

    def close(self) -> None:
        """Let every block go (as the child exits, after its threads stopped).

        A child ends in ``os._exit``, where nothing is collected: under the
        ``file_system`` sharing strategy a block still held then stays in
        /dev/shm until the loader's process exits (its reference count in the
        segment never drops), one arena's worth per epoch without
        ``persistent_workers``. Blocks the parent still maps go when it lets go.
        """
        with self._lock:
            self._drop(len(self._free))
            self._by_id.clear()
            self._by_addr.clear()

    def dumps(self, obj: Any) -> bytes:
        """Pickle ``obj`` as ``ForkingPickler`` does, its batches in this arena by block id."""
        buf = io.BytesIO()
        pickler = _ArenaPickler(buf, self)
        try:
            pickler.dump(obj)
        except BaseException:
            self.unsend(pickler.sent)
            raise
        if len(pickler.sent) > self._per_result:
            with self._lock:
                self._per_result = max(self._per_result, len(pickler.sent))
                self.slack = self._batches * self._per_result
                self.max_blocks = 2 * self.slack + 8
        return buf.getvalue()


class _ArenaPickler(ForkingPickler):
    def __init__(self, file: Any, arena: ChildArena) -> None:
        super().__init__(file)
        self._arena = arena
        self.sent: list[tuple[Any, ...]] = []

    def reducer_override(self, obj: Any) -> Any:
        # Exactly torch.Tensor: subclasses and Parameters keep torch's reduction.
        if type(obj) is torch.Tensor:
            reduced = self._arena.reduce(obj)
            if reduced is not None:
                self.sent.append(reduced[1])
                return reduced
        return NotImplemented


# --- the parent's side --------------------------------------------------------

_mirrors: dict[str, "Mirror"] = {}
_mirrors_lock = threading.Lock()
_tokens = itertools.count()


def mirror_count() -> int:
    """How many mirrors are open in this process (for tests: a stopped pool leaves none)."""
    with _mirrors_lock:
        return len(_mirrors)


class Mirror:
    """The parent's mapping of one child's arena, and the loans of its blocks to the consumer.

    Open from before the child starts until :meth:`close` (after the child's
    receiver has stopped): results arriving from it are rebuilt here.
    """

    def __init__(self) -> None:
        self.token = f"{os.getpid()}-{next(_tokens)}"
        # Reentrant: a loan's callback can run in lend() itself (a garbage
        # collection there frees an older batch).
        self._lock = threading.RLock()
        self._blocks: dict[int, np.ndarray] = {}
        # id(weak reference) -> (the reference, block id): keeps each
        # reference alive so that its callback runs.
        self._loans: dict[int, tuple[weakref.ref, int]] = {}
        self._released: collections.deque[int] = collections.deque()
        with _mirrors_lock:
            _mirrors[self.token] = self

    def lend(self, block_id: int, storage: torch.UntypedStorage | None, forget: tuple[int, ...], nbytes: int,
             dtype: torch.dtype, offset: int, size: tuple[int, ...], stride: tuple[int, ...]) -> torch.Tensor:
        """The tensor a child sent in block ``block_id`` (its storage when sent for the first time)."""
        with self._lock:
            for i in forget:
                self._blocks.pop(i, None)
            if storage is not None:
                self._blocks[block_id] = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
            # As BufferPool: a fresh memoryview per loan, watched by a weak
            # reference; every array and tensor made from the loan keeps it.
            lent = np.frombuffer(memoryview(self._blocks[block_id])[:nbytes], dtype=np.uint8)
            ref = weakref.ref(lent.base, self._give_back)
            self._loans[id(ref)] = (ref, block_id)
        return torch.from_numpy(lent).view(dtype).as_strided(size, stride, offset)

    def _give_back(self, ref: weakref.ref) -> None:
        with self._lock:
            entry = self._loans.pop(id(ref), None)
            if entry is not None:
                self._released.append(entry[1])

    def take_released(self) -> tuple[int, ...]:
        """Ids of the blocks let go of since the last call, for the child (one per batch)."""
        with self._lock:
            ids = tuple(self._released)
            self._released.clear()
        return ids

    def close(self) -> None:
        """Stop rebuilding this child's results; tensors already lent keep their memory (idempotent)."""
        with _mirrors_lock:
            _mirrors.pop(self.token, None)
        with self._lock:
            self._blocks.clear()
            self._released.clear()


def _lend(token: str, *args: Any) -> torch.Tensor:
    """Unpickle a batch sent by block id (in the parent)."""
    with _mirrors_lock:
        mirror = _mirrors.get(token)
    if mirror is None:
        raise RuntimeError("a batch arrived from a worker process of a loader that has stopped")
    return mirror.lend(*args)
