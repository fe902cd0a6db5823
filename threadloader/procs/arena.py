"""Batch buffers in shared memory that a ``worker_processes`` child reuses once the loader's process lets go.

Without it a child builds every batch in fresh shared memory (as DataLoader's
workers do): each batch costs a new segment, a file descriptor passed to the
parent, a mapping there, and a page fault per 4 KiB page on both sides (150
per 224x224 float image), and in one process many threads faulting and
unmapping serialise on the kernel's address-space lock.

Here each child keeps an arena (:class:`ChildArena`): shared-memory blocks,
lent for batch buffers (``frame_collate``'s, and ``default_collate``'s
through :mod:`threadloader._platform.torch_compat`) exactly as
:class:`threadloader.images.buffers.BufferPool` lends host memory. A block reaches the
parent once, as torch shares any storage; the parent keeps it mapped
(:class:`threadloader.procs.mirror.Mirror`), and afterwards a batch in it travels as its block's id.
The parent lends the consumer a tensor over its mapping and watches it as the
pool watches its loans: when the last tensor, view or array of that batch is
gone, the block's id goes back to the child with its next job, and the
child lends the block again only then, and only once its own references are
gone too. Nothing is overwritten while anyone can still read it.

A result is pickled with its arena tensors as references (pickle's persistent
ids); how to rebuild them travels beside it as plain values, the storages of
blocks the parent does not map yet in a pickle of their own. So whatever fails
to unpickle in the parent, it knows which blocks the result held: their loans
go back to the child, and a block it could not map is retired there.

Batch buffers of up to :data:`_PACK_MAX` bytes are cut in turn from a block
per worker thread (:meth:`ChildArena.take`): each block holds a file
descriptor in both processes, so a batch of 50 small stacked keys must not
take 50 blocks. A block serves as a tensor's memory wherever in it the tensor
lies (:meth:`ChildArena._holding`).

Only plain CPU tensors travel by reference (the pickler checks): those whose
memory is an arena block, and those whose memory is all their own and not
shared yet (labels, samples made in ``__getitem__``), copied into a block
first, where torch's reduction would move them into a fresh segment; and NumPy
arrays of :data:`_ARRAY_MIN` bytes or more, copied into a block where pickle
would copy them into the message. Copies smaller than a block are cut from
the worker thread's slab too (:class:`_Copies`). The rest (shared memory,
views of larger tensors, subclasses...) goes through torch's reductions and
pickle as before.
Past :attr:`ChildArena.max_blocks` blocks in use (a training loop keeping its
batches), new batches get fresh shared memory, as DataLoader's do.
"""

from __future__ import annotations

import bisect
import collections
import copyreg
import io
import itertools
import pickle
import threading
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch

from .._platform import torch_compat as _torch_compat
from ..images.buffers import BufferPool, nbytes_of

__all__ = ["ChildArena", "forking_dumps"]

#: Blocks are rounded up to this many bytes: batches of nearby sizes share them.
GRANULE = 64 << 10
#: Copies packed into one block start at multiples of this (a cache line; any dtype's alignment).
_ALIGN = 64
#: NumPy arrays smaller than this pickle by value (cheaper than a loan in a block).
_ARRAY_MIN = 4 << 10
#: Batch buffers up to this size share blocks (a worker thread's current slab, see ChildArena.take).
_PACK_MAX = 16 << 10


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
        token: the parent's :class:`~threadloader.procs.mirror.Mirror` for this child.
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
        self._by_id: dict[int, _Block] = {}
        self._by_addr: dict[int, _Block] = {}  # keyed by the block's address
        self._addrs: list[int] = []  # the keys of _by_addr, sorted: which block holds an address
        #: Per worker thread: ``slab``, the block small buffers are cut from (see _cut).
        self._local = threading.local()
        self._ids = itertools.count()
        #: Ids of blocks this child let go of that the parent maps: it unmaps
        #: them when it reads them (with the next batch sent by id).
        self._forgotten: list[int] = []

    @property
    def max_blocks(self) -> int:
        """Most blocks at once. Each holds a file descriptor here and one in the
        parent: a training loop that keeps its batches gets fresh shared memory
        past this, as from DataLoader's workers, whose descriptors close once
        sent (the parent's limit, not the child's, runs out first)."""
        return 2 * self.slack + 8

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A batch buffer: an arena block, or fresh shared memory when :attr:`max_blocks` are all in use.

        Buffers of up to :data:`_PACK_MAX` bytes (a batch's labels, each key
        of a dict sample that ``default_collate`` stacks) are cut from the
        calling thread's current block, in order, until it is full: a block
        each would hold a file descriptor each in both processes (a sample of
        50 keys, 8 workers: past the usual limit of 1024 in the loader's
        process). The block is lent again once every batch cut from it is
        let go of, here and in the parent.
        """
        nbytes = nbytes_of(shape, dtype)
        if nbytes == 0:  # nothing to share: torch sends an empty storage without a descriptor
            return torch.empty(shape, dtype=dtype)
        if nbytes <= _PACK_MAX:
            lent = self._cut(nbytes)
            if lent is not None:
                return torch.from_numpy(lent).view(dtype).view(shape)
        with self._lock:
            if self._has_room(self.capacity(nbytes)):
                return super().take(shape, dtype)
        return _torch_compat.new_shared(shape, dtype)

    def _cut(self, nbytes: int) -> np.ndarray | None:
        """``nbytes`` of the calling thread's slab (a new one when it is full); None: no block left."""
        slab = getattr(self._local, "slab", None)  # [the block's bytes as lent here, bytes used, the block]
        start = 0 if slab is None else -(-slab[1] // _ALIGN) * _ALIGN
        # A slab the parent lost (retired) is left too: what is cut from it
        # would travel as copies. (Ids are never reused: a stale read of
        # _by_id here costs one such copy at most.)
        if slab is None or start + nbytes > len(slab[0]) or slab[2].id not in self._by_id:
            # The slab's loan here ends with the last batch cut from it.
            self._local.slab = slab = None
            lent = self._block_bytes(GRANULE)
            if lent is None:
                return None
            with self._lock:
                block = self._by_addr[lent.__array_interface__["data"][0]]
            self._local.slab = slab = [lent, 0, block]
            start = 0
        slab[1] = start + nbytes
        return slab[0][start:start + nbytes]

    def _block_bytes(self, nbytes: int) -> np.ndarray | None:
        """A loan of ``nbytes`` of a block (:meth:`take_bytes`), or None when :attr:`max_blocks` are all in use."""
        with self._lock:
            if self._has_room(self.capacity(nbytes)):
                return self.take_bytes(nbytes)
        return None

    def _has_room(self, capacity: int) -> bool:
        # Caller holds the lock. A free block of that size, or room for a new one.
        return len(self._by_id) < self.max_blocks or any(e[0] == capacity for e in self._free)

    def _new_block(self, capacity: int) -> np.ndarray:
        tensor = _torch_compat.new_shared((capacity,))
        block = _Block(next(self._ids), tensor.untyped_storage(), tensor.numpy(), capacity)
        self._by_id[block.id] = block
        self._by_addr[tensor.data_ptr()] = block
        bisect.insort(self._addrs, tensor.data_ptr())
        return block.array

    def _reusable(self, array: np.ndarray) -> bool:
        block = self._by_addr.get(array.__array_interface__["data"][0])
        if block is None:  # retired, or let go of after close(): it goes with its last reference
            return False
        if block.parent_loans:
            block.parked = True  # put back by parent_released
            return False
        return True

    def _forget(self, array: np.ndarray) -> None:
        block = self._by_addr.get(array.__array_interface__["data"][0])
        if block is None:
            return
        self._retire(block)
        if block.sent:
            self._forgotten.append(block.id)

    def parent_released(self, ids: tuple[int, ...], forked: tuple[int, ...] = ()) -> None:
        """The parent let go of one batch in each of these blocks (ids repeat for several).

        An id ``-1 - i`` is block ``i``'s batch that the parent could not
        receive: the parent does not map that block, so it is never lent again.

        Args:
            forked: blocks a process forked from the parent may still read
                (see :meth:`threadloader.procs.mirror.Mirror.fork_holds_loans`): never lent again, and
                the parent unmaps them when it reads them (with the next
                result). First, so that no release below puts one back.
        """
        with self._lock:
            for i in forked:
                block = self._by_id.get(i)
                if block is not None:
                    self._retire(block)
                    self._forgotten.append(i)
            for i in ids:
                lost = i < 0
                block = self._by_id.get(-1 - i if lost else i)
                if block is None or block.parent_loans <= 0:  # (a parent never frees twice)
                    continue
                if lost:
                    self._retire(block)
                self._end_parent_loan(block)

    def _end_parent_loan(self, block: _Block) -> None:
        # Caller holds the lock.
        block.parent_loans -= 1
        if block.parent_loans == 0 and block.parked and block.id in self._by_id:
            block.parked = False
            self._put_back(block.capacity, block.array)

    def _retire(self, block: _Block) -> None:
        # Caller holds the lock. Out of the arena: its memory goes with its
        # last reference here (see _reusable).
        address = block.storage.data_ptr()
        del self._by_id[block.id], self._by_addr[address]
        del self._addrs[bisect.bisect_left(self._addrs, address)]

    def _holding(self, address: int) -> tuple[_Block, int] | tuple[None, int]:
        """The block whose memory ``address`` is in, and the offset there (caller holds the lock)."""
        i = bisect.bisect_right(self._addrs, address) - 1
        if i >= 0:
            block = self._by_addr[self._addrs[i]]
            if address - self._addrs[i] < block.capacity:
                return block, address - self._addrs[i]
        return None, 0

    def reference(self, tensor: torch.Tensor, copies: "_Copies | None" = None,
                  ) -> tuple[_Block, tuple[Any, ...], torch.UntypedStorage | None] | None:
        """``tensor``'s block, how the parent rebuilds it, and the block's storage if the parent does not map it yet.

        A plain CPU tensor whose memory is not shared yet and is all its own
        (a label tensor, a sample made in ``__getitem__``) is copied into a
        block first: torch's reduction would move it into a fresh
        shared-memory segment (in place: a tensor the dataset returns again
        would then travel as that segment, aliased in the parent; here it
        arrives as a new copy each time) and pass its descriptor. A
        tensor over shared memory keeps torch's way (no copy, the parent's
        tensor aliases it), and so does a view of a larger tensor (torch
        moves that storage to shared memory once; copying it whole for every
        result could cost far more).

        Args:
            copies: the result's copies so far (see :class:`_Copies`); None: copy nothing.

        Returns:
            None when ``tensor`` travels by torch's reduction instead. Counts a
            parent loan of the block (undone by :meth:`unsend` if the message
            is not sent after all).
        """
        if (tensor.device.type != "cpu" or tensor.requires_grad or tensor.is_conj() or tensor.is_neg()
                or tensor.layout != torch.strided or tensor.is_quantized or tensor.is_nested):
            return None
        storage = tensor.untyped_storage()
        nbytes, address = storage.nbytes(), storage.data_ptr()
        into = None
        with self._lock:
            block, start = self._holding(address)
            if block is None and copies is not None:
                # By the storage, not its address: two storages can start at
                # one address (from_numpy of an array and of its first rows)
                # and DataLoader's workers move each to shared memory of its own.
                placed = copies.placed.get(id(storage))
                if (placed is None and nbytes and tensor.numel() * tensor.element_size() == nbytes
                        and not storage.is_shared()):
                    placed = into = copies.place(self, nbytes)
                    if placed is not None:
                        copies.placed[id(storage)] = placed
                        copies.storages.append(storage)  # its id stays its own while pickling
                if placed is not None:
                    block, start, _ = placed
            if block is None or start + nbytes > block.capacity:
                return None
            first = self._lend_to_parent(block)
        if into is not None:
            torch.from_numpy(into[2]).copy_(torch.empty(0, dtype=torch.uint8).set_(storage))
        layout = (tensor.storage_offset(), tuple(tensor.size()), tuple(tensor.stride()))
        return block, (block.id, start, nbytes, tensor.dtype, layout), first

    def reference_array(self, array: np.ndarray, copies: "_Copies",
                        ) -> tuple[_Block, tuple[Any, ...], torch.UntypedStorage | None] | None:
        """As :meth:`reference`, for a NumPy array (an unbatched :class:`~threadloader.Frame`'s pixels...).

        Pickling copies an array by value (into the pickle, through the pipe,
        out of it: DataLoader's way); here it is copied once, into a block, and
        arrives as an array of its own as well (same dtype, shape, C or
        Fortran order, writable). None for arrays of objects and small ones
        (:data:`_ARRAY_MIN`), which pickle cheaper.
        """
        nbytes = array.nbytes
        # Not native byte order: pickle rebuilds some such dtypes in native
        # order, as DataLoader's results arrive; pickling keeps that.
        if nbytes < _ARRAY_MIN or array.dtype.hasobject or not array.dtype.isnative:
            return None
        with self._lock:
            placed = copies.place(self, nbytes)
            if placed is None:
                return None
            block, start, lent = placed
            first = self._lend_to_parent(block)
        order = "F" if array.flags.f_contiguous and not array.flags.c_contiguous else "C"
        np.copyto(lent.view(array.dtype).reshape(array.shape, order=order), array, casting="no")
        return block, (block.id, start, nbytes, array.dtype, (order, array.shape)), first

    def _lend_to_parent(self, block: _Block) -> torch.UntypedStorage | None:
        """Count a parent loan of ``block``; its storage if it is its first trip (caller holds the lock)."""
        block.parent_loans += 1  # before this process's loan of a copy can end
        first = None if block.sent else block.storage
        block.sent = True
        return first

    def unsend(self, refs: list[tuple[_Block, tuple[Any, ...], torch.UntypedStorage | None]],
               forget: tuple[int, ...] = ()) -> None:
        """Undo :meth:`reference` (and the taking of ``forget``) for a message that was not sent."""
        with self._lock:
            self._forgotten.extend(forget)
            for block, _, first in refs:
                if first is not None:
                    block.sent = False
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
            self._addrs.clear()
            # Every thread's slab: a worker run in the child's main thread
            # (its lone worker) never ends, and would keep its slab's block.
            self._local = threading.local()

    def dumps(self, obj: Any) -> tuple[bytes, tuple[Any, ...] | None]:
        """Pickle ``obj`` as ``ForkingPickler`` does, but its tensors in this arena as references.

        Returns:
            ``(data, arena)`` for :func:`loads`: ``arena`` is None when
            ``obj`` holds no arena tensor (and no block is to be unmapped),
            else ``(token, metas, forget, storages)``: how the parent
            rebuilds each referenced tensor (plain values, which unpickle
            whatever happens), the blocks it is to unmap, and the pickled
            storages of the blocks it does not map yet (None if none).
        """
        buf = io.BytesIO()
        pickler = _ArenaPickler(buf, self)
        with self._lock:
            forget, self._forgotten = tuple(self._forgotten), []
        try:
            pickler.dump(obj)
            refs = pickler.refs
            firsts = tuple(first for _, _, first in refs)
            storages = forking_dumps(firsts) if any(f is not None for f in firsts) else None
        except BaseException:
            self.unsend(pickler.refs, forget)
            raise
        blocks = len({block.id for block, _, _ in refs})
        if blocks > self._per_result:
            with self._lock:
                self._per_result = max(self._per_result, blocks)
                self.slack = self._batches * self._per_result
        if not refs and not forget:
            return buf.getvalue(), None
        return buf.getvalue(), (self.token, tuple(meta for _, meta, _ in refs), forget, storages)


def forking_dumps(obj: Any) -> bytes:
    """``obj`` pickled by ``ForkingPickler``: torch's reductions, tensors and storages as shared-memory handles."""
    buf = io.BytesIO()
    ForkingPickler(buf).dump(obj)
    return buf.getvalue()


class _Copies:
    """Where one result's copies went (:meth:`ChildArena.reference`).

    Tensors that shared memory in the child share their copy. Copies smaller
    than a granule (a label tensor, many small arrays of one sample) are cut
    from the worker thread's slab, as small batch buffers are
    (:meth:`ChildArena.take`): each block holds a file descriptor in both
    processes, so a result of many small tensors must not take a block each.
    """

    __slots__ = ("placed", "storages", "_loans")

    def __init__(self) -> None:
        #: id of a tensor storage here -> (block, byte offset in it, the copy's bytes as lent here)
        self.placed: dict[int, tuple[_Block, int, np.ndarray]] = {}
        #: Those storages, kept until the result is pickled: no other takes their ids meanwhile.
        self.storages: list[torch.UntypedStorage] = []
        # This process's loans of the copies: kept until the result is
        # pickled, so that no block is lent again before its parent loans
        # are counted.
        self._loans: list[np.ndarray] = []

    def place(self, arena: ChildArena, nbytes: int) -> tuple[_Block, int, np.ndarray] | None:
        """Room for a copy of ``nbytes`` (caller holds the arena's lock); None: none left."""
        lent = arena._cut(nbytes) if nbytes < GRANULE else arena._block_bytes(nbytes)
        if lent is None:
            return None
        self._loans.append(lent)
        block, start = arena._holding(lent.__array_interface__["data"][0])
        return block, start, lent


#: ForkingPickler's reducers (torch's among them) over copyreg's, as a ForkingPickler finds them.
_REDUCERS = collections.ChainMap(
    ForkingPickler._extra_reducers, getattr(ForkingPickler, "_copyreg_dispatch_table", copyreg.dispatch_table))


class _ArenaPickler(ForkingPickler):
    """``ForkingPickler`` that pickles the tensors and arrays the arena takes as persistent ids.

    The ids are indices into :attr:`refs`.
    """

    def __init__(self, file: Any, arena: ChildArena) -> None:
        # ForkingPickler's own __init__ copies every reducer into a new
        # table: microseconds per result. A live view of the same tables
        # finds the same reducers (its own first, as the copy's update).
        pickle.Pickler.__init__(self, file)
        self.dispatch_table = _REDUCERS
        self._arena = arena
        self.refs: list[tuple[_Block, tuple[Any, ...], torch.UntypedStorage | None]] = []
        # id(object) -> (its index, the object): one twice in a result arrives
        # as one object twice, as pickle's memo makes it for any other. The
        # object is kept, as pickle's memo keeps it: a temporary (made by a
        # __getstate__) freed meanwhile would leave its id, and its memory's
        # address, to the next one, which would then be sent as this one.
        self._index: dict[int, tuple[int, Any]] = {}
        self._copies = _Copies()

    def persistent_id(self, obj: Any) -> int | None:
        # Exactly torch.Tensor and np.ndarray: subclasses (Parameters, memmaps...) keep their reductions.
        kind = type(obj)
        if kind is not torch.Tensor and kind is not np.ndarray:
            return None
        known = self._index.get(id(obj))
        if known is not None:
            return known[0]
        if kind is np.ndarray:
            ref = self._arena.reference_array(obj, self._copies)
        else:
            ref = self._arena.reference(obj, self._copies)
        if ref is None:
            return None
        index = len(self.refs)
        self._index[id(obj)] = (index, obj)
        self.refs.append(ref)
        return index
