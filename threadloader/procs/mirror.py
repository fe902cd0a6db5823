"""The loader's side of the ``worker_processes`` arenas: each child's blocks mapped here, and their loans.

A :class:`Mirror` per child (see :mod:`threadloader.procs.arena` for the
child's side and the whole design) keeps the child's shared-memory blocks
mapped once each, rebuilds a result's arena tensors over them (:func:`loads`)
and lends them to the consumer: when the last tensor, view or array of a batch
is gone, the block's id goes back to the child with its next job
(:meth:`Mirror.take_released`). A process forked from this one (not a worker
process of ours) keeps copies of the batches lent at the fork: those blocks
are never lent again (:meth:`Mirror.fork_holds_loans`).
"""

from __future__ import annotations

import collections
import io
import itertools
import os
import pickle
import threading
import weakref
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch

from .._platform import fork as _fork

__all__ = ["Mirror", "discard", "loads", "mirror_count"]

_mirrors: dict[str, "Mirror"] = {}
_mirrors_lock = threading.Lock()
_fork.renew_after_fork(__name__, "_mirrors_lock")
_tokens = itertools.count()


def mirror_count() -> int:
    """How many mirrors are open in this process (for tests: a stopped pool leaves none)."""
    with _mirrors_lock:
        return len(_mirrors)


class Mirror:
    """The parent's mapping of one child's arena, and the loans of its blocks to the consumer.

    Open from before the child starts until :meth:`close` (as the pool
    stops): results arriving from it are rebuilt here.
    """

    def __init__(self) -> None:
        self.token = f"{os.getpid()}-{next(_tokens)}"
        # Reentrant: a loan's callback can run in _lend() itself (a garbage
        # collection there frees an older batch).
        self._lock = threading.RLock()
        _fork.renew_lock_after_fork(self, "_lock")
        self._blocks: dict[int, np.ndarray] = {}
        # id(weak reference) -> (the reference, block id): keeps each
        # reference alive so that its callback runs.
        self._loans: dict[int, tuple[weakref.ref, int]] = {}
        self._released: collections.deque[int] = collections.deque()
        #: Blocks lent when this process forked, to be retired by the child (see fork_holds_loans).
        self._forked: set[int] = set()
        with _mirrors_lock:
            _mirrors[self.token] = self

    def load(self, data: bytes, metas: tuple[tuple[Any, ...], ...], forget: tuple[int, ...],
             storages: bytes | None) -> Any:
        """Unpickle a result pickled by :meth:`ChildArena.dumps`.

        Whatever fails, every block the result references goes back to the
        child: as released once the tensors made here are gone, or as lost
        (never to be lent again) when this process could not map it. A lost
        block that results already sent name by id (a worker thread's slab
        of small buffers, :meth:`ChildArena.take`) fails those results too,
        with a ``RuntimeError`` saying so; the child, told with its next
        job, cuts no more from it.
        """
        with self._lock:
            for i in forget:
                self._blocks.pop(i, None)
        try:
            firsts = ForkingPickler.loads(storages) if storages is not None else (None,) * len(metas)
        except BaseException:
            # Only the blocks whose storage was in this message are lost; the
            # result's loans of blocks mapped already just end.
            with self._lock:
                self._released.extend(meta[0] for meta in metas if meta[0] in self._blocks)
                self._lost([meta[0] for meta in metas if meta[0] not in self._blocks])
            raise
        with self._lock:
            for meta, storage in zip(metas, firsts):
                if storage is not None:
                    self._blocks[meta[0]] = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
            unknown = [meta[0] for meta in metas if meta[0] not in self._blocks]
            if unknown:  # its storage was in a result this process could not receive
                self._lost(unknown)
                self._released.extend(meta[0] for meta in metas if meta[0] not in unknown)
                raise RuntimeError("a batch buffer of this worker process was lost with an earlier result "
                                   "that could not be received")
            tensors = [self._lend(*meta) for meta in metas]
        return _ArenaUnpickler(io.BytesIO(data), tensors).load()

    def _lend(self, block_id: int, start: int, nbytes: int, dtype: torch.dtype | np.dtype,
              layout: tuple[Any, ...]) -> torch.Tensor | np.ndarray:
        # Caller holds the lock. As BufferPool: a fresh memoryview per loan,
        # watched by a weak reference; every array and tensor made from the
        # loan keeps it.
        lent = np.frombuffer(memoryview(self._blocks[block_id])[start:start + nbytes], dtype=np.uint8)
        ref = weakref.ref(lent.base, self._give_back)
        self._loans[id(ref)] = (ref, block_id)
        if isinstance(dtype, np.dtype):
            order, shape = layout
            return lent.view(dtype).reshape(shape, order=order)
        offset, size, stride = layout
        # set_ on the bytes, not view(dtype): a view of an odd number of bytes
        # as a wider dtype (int16 batch, int32 view) travels as DataLoader's does.
        return torch.empty(0, dtype=dtype).set_(torch.from_numpy(lent).untyped_storage(), offset, size, stride)

    def _lost(self, ids: list[int]) -> None:
        with self._lock:
            for i in ids:
                self._blocks.pop(i, None)
                self._released.append(-1 - i)

    def _give_back(self, ref: weakref.ref) -> None:
        with self._lock:
            entry = self._loans.pop(id(ref), None)
            if entry is not None:
                self._released.append(entry[1])

    def fork_holds_loans(self) -> None:
        """This process is forking (not a worker process of ours): the blocks lent now are never to be lent again.

        The forked process has copies of the references to them, over its own
        mapping of the same shared memory, so a batch the child built there
        later would show through (DataLoader's batches are never reused). The
        child retires them when told (:meth:`take_released`).
        """
        with self._lock:
            self._forked.update(block_id for _, block_id in self._loans.values())

    def take_released(self) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """What to tell the child (:meth:`ChildArena.parent_released`'s arguments), None if nothing.

        One id per batch let go of, and the blocks a fork holds.
        """
        with self._lock:
            if not self._released and not self._forked:
                return None
            ids, forked = tuple(self._released), tuple(self._forked)
            self._released.clear()
            self._forked.clear()
        return ids, forked

    def close(self) -> None:
        """Stop rebuilding this child's results; tensors already lent keep their memory (idempotent)."""
        with _mirrors_lock:
            _mirrors.pop(self.token, None)
        with self._lock:
            self._blocks.clear()
            self._released.clear()


def _forking() -> None:
    # Before the fork and after it in this process: a loan that ends in
    # another thread meanwhile was still alive at the fork. Our own worker
    # processes never read another child's batches.
    if _fork.forking_own_child():
        return
    with _mirrors_lock:
        mirrors = list(_mirrors.values())
    for mirror in mirrors:  # each lock on its own: no order between the two
        mirror.fork_holds_loans()


def _forked_child() -> None:
    # A forked process is not the loader's: the mirrors are not its own (it
    # receives nothing). Their locks, which threads that do not exist here may
    # have held, are renewed (_fork); its copies of lent batches still give
    # loans back.
    _mirrors.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_forking, after_in_parent=_forking, after_in_child=_forked_child)


class _ArenaUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, tensors: list[torch.Tensor | np.ndarray]) -> None:
        super().__init__(file)
        self._tensors = tensors

    def persistent_load(self, pid: Any) -> torch.Tensor:
        return self._tensors[pid]


def discard(data: bytes, arena: tuple[Any, ...]) -> None:
    """Unpickle a result :meth:`ChildArena.dumps` pickled, and drop it, without lending any block.

    For a result nobody reads (its pool stops): the storages and the
    tensors torch sent in it are received and let go of (see
    :meth:`threadloader.procs.wire.Parcel.discard`).

    Raises:
        Exception: whatever unpickling raises.
    """
    _token, metas, _forget, storages = arena
    if storages is not None:
        ForkingPickler.loads(storages)
    _ArenaUnpickler(io.BytesIO(data), [None] * len(metas)).load()


def loads(data: bytes, arena: tuple[Any, ...]) -> Any:
    """Unpickle (in the parent) a result a child pickled with :meth:`ChildArena.dumps`.

    Raises:
        RuntimeError: its loader's pool has stopped, or a block it references was lost.
        Exception: whatever unpickling the result raises.
    """
    token, metas, forget, storages = arena
    with _mirrors_lock:
        mirror = _mirrors.get(token)
    if mirror is None:
        raise RuntimeError("a batch arrived from a worker process of a loader that has stopped")
    return mirror.load(data, metas, forget, storages)
