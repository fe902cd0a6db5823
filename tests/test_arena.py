"""A worker process's arena of shared-memory batch buffers, both ends in this process.

:class:`ChildArena` (a child's side) and :class:`Mirror` (the parent's) are
driven by hand here: what a child pickles, the parent unpickles; what the
parent lets go of, the child hears of only when told. The loader-level
behaviour (through real child processes) is in ``test_procs.py``.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import signal
import threading
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch
from helpers import held_by_another_thread

from threadloader._platform import fork as _fork
from threadloader.procs.arena import GRANULE, ChildArena
from threadloader.procs.mirror import Mirror, loads, mirror_count


@pytest.fixture
def ends():
    mirror = Mirror()
    arena = ChildArena(mirror.token, batches=2)
    yield arena, mirror
    mirror.close()


def _batch(arena: ChildArena, value: int, n: int = 4) -> torch.Tensor:
    # As frame_collate: an (N, C, H, W) channels-last view of an (N, H, W, C)
    # buffer, larger than _PACK_MAX: a block of its own.
    t = arena.take((n, 48, 32, 3), torch.uint8).permute(0, 3, 1, 2)
    t.fill_(value)
    return t


def _receive(data: bytes, refs):
    return ForkingPickler.loads(data) if refs is None else loads(data, refs)


def _send(arena: ChildArena, obj):
    """Child pickles, parent unpickles (the queue between them is left out)."""
    return _receive(*arena.dumps(obj))


def _tell_child(arena: ChildArena, mirror: Mirror) -> None:
    gc.collect()
    arena.parent_released(*(mirror.take_released() or ((), ())))


def test_a_batch_arrives_with_its_values_shape_and_strides(ends):
    arena, mirror = ends
    sent = _batch(arena, 5)
    got, label = _send(arena, (sent, torch.tensor([1, 2])))
    assert torch.equal(got, sent) and got.stride() == sent.stride() and got.dtype == torch.uint8
    assert label.tolist() == [1, 2]
    floats = arena.take((2, 3), torch.float32)
    floats.copy_(torch.arange(6.0).view(2, 3))
    view = floats[:, 1:]
    got = _send(arena, view)
    assert torch.equal(got, view) and got.storage_offset() == view.storage_offset()


def test_a_block_is_lent_again_only_once_both_processes_let_go(ends):
    arena, mirror = ends
    sent = _batch(arena, 7)
    ptr = sent.data_ptr()
    got = _send(arena, sent)
    del sent  # the child is done with it; the parent is not
    _tell_child(arena, mirror)
    for i in range(20):
        b = _batch(arena, i % 7)
        assert b.data_ptr() != ptr, "reused while the parent held it"
        _send(arena, b)  # received and dropped at once
        del b
        _tell_child(arena, mirror)
    view, arr = got[1:3], got.numpy()
    del got
    _tell_child(arena, mirror)
    assert _batch(arena, 1).data_ptr() != ptr, "reused while a view was alive in the parent"
    assert torch.all(view == 7) and np.all(arr == 7)
    del view, arr
    gc.collect()
    b = _batch(arena, 2)
    assert b.data_ptr() != ptr, "reused before the child was told"
    del b
    _tell_child(arena, mirror)
    assert _batch(arena, 3).data_ptr() == ptr, "the released block was not reused"


def test_a_block_lent_when_this_process_forks_is_never_lent_again(ends):
    # The forked process holds copies of the references, over its own mapping
    # of the block: a batch the child built there later would show through.
    arena, mirror = ends
    got = _send(arena, _batch(arena, 7))
    ptr = got.data_ptr()
    block = arena._holding(ptr)[0].id
    _send(arena, _batch(arena, 1))  # another block, let go of before the fork
    gc.collect()
    mirror.fork_holds_loans()
    del got
    _tell_child(arena, mirror)
    assert block not in arena._by_id
    assert block in mirror._blocks  # unmapped here when the child says so, with its next result
    for i in range(20):
        b = _batch(arena, i % 7)
        assert b.data_ptr() != ptr, "lent again after the fork"
        _send(arena, b)
        del b
        _tell_child(arena, mirror)
    assert block not in mirror._blocks


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("ours", [False, True])
def test_a_fork_marks_the_blocks_lent_unless_it_starts_a_worker_process_of_ours(ends, ours):
    arena, mirror = ends
    got = _send(arena, _batch(arena, 7))
    with _fork.forking_for(object()) if ours else contextlib.nullcontext():
        pid = os.fork()
        if pid == 0:
            os._exit(0)
    os.waitpid(pid, 0)
    released = mirror.take_released()
    assert released == (None if ours else ((), (arena._holding(got.data_ptr())[0].id,)))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_process_forked_while_another_thread_holds_a_mirrors_lock_can_fork_and_let_go_in_turn(ends):
    # The fork hook takes each mirror's lock: in a forked process the parent's
    # mirrors' locks (held there by threads that do not exist) waited for ever.
    arena, mirror = ends
    box = [_send(arena, _batch(arena, 7))]
    with held_by_another_thread(mirror._lock):
        with _fork.forking_for(object()):  # (here the hook would wait for the holder, which waits for us)
            pid = os.fork()
        if pid == 0:  # the child, from its only thread (a new one could take the holder's id)
            signal.alarm(10)  # never wait for ever: killed by SIGALRM
            grandchild = os.fork()
            if grandchild == 0:
                os._exit(0)
            os.waitpid(grandchild, 0)
            box.clear()  # its copy of the batch: the loan goes back
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_block_travels_once_then_by_id(ends):
    arena, mirror = ends
    first = arena.dumps(_batch(arena, 1))
    assert first[1][3] is not None  # the block's storage, pickled by torch
    _receive(*first)
    _tell_child(arena, mirror)
    again = arena.dumps(_batch(arena, 2))  # the same block, which the parent maps already
    assert again[1][3] is None and again[1][1][0][0] == first[1][1][0][0]
    assert torch.all(_receive(*again) == 2)


def test_a_tensor_twice_in_a_result_arrives_as_one_tensor_twice(ends):
    arena, mirror = ends
    b = _batch(arena, 3)
    got = _send(arena, {"a": b, "b": b, "c": [b]})
    assert got["a"] is got["b"] is got["c"][0] and torch.all(got["a"] == 3)


def test_a_wider_dtype_view_of_an_odd_number_of_bytes_arrives_as_dataloaders(ends):
    arena, mirror = ends
    b = arena.take((3,), torch.int16)
    b.copy_(torch.tensor([1, 2, 3], dtype=torch.int16))
    view = b[:2].view(torch.int32)  # 4 of the storage's 6 bytes
    got = _send(arena, view)
    assert torch.equal(got, view) and got.tolist() == [2 << 16 | 1]


class _FailsInParent:
    """Pickles fine; its rebuild raises (as one needing a module only the child has)."""

    def __reduce__(self):
        return _refuse, ()


def _refuse():
    raise ImportError("no module named 'only_in_the_child'")


def test_a_result_that_fails_to_unpickle_gives_its_blocks_back(ends):
    arena, mirror = ends
    b = _batch(arena, 4)
    ptr = b.data_ptr()
    with pytest.raises(ImportError):
        _send(arena, (b, _FailsInParent()))
    del b
    _tell_child(arena, mirror)
    assert _batch(arena, 5).data_ptr() == ptr  # its loan came back: reused


def test_a_block_whose_storage_could_not_be_received_is_never_lent_again(ends):
    arena, mirror = ends
    b = _batch(arena, 6)
    data, refs = arena.dumps(b)
    again = arena.dumps(b)  # the same batch sent again (a cached one): by id, before the parent mapped it
    with pytest.raises(Exception):
        _receive(data, refs[:3] + (b"not a pickle",))  # e.g. no file descriptor left to receive it
    with pytest.raises(RuntimeError, match="lost with an earlier result"):
        _receive(*again)
    del b, data, refs, again
    _tell_child(arena, mirror)
    assert list(arena._by_id) == []  # retired (its memory went with the batch)
    fresh = _batch(arena, 7)
    data, refs = arena.dumps(fresh)
    assert refs[1][0][0] == 1 and refs[3] is not None  # a new block, sent with its storage
    assert torch.all(_receive(data, refs) == 7) and list(mirror._blocks) == [1]


def test_a_message_that_fails_to_pickle_gives_its_blocks_back(ends):
    arena, mirror = ends
    b = _batch(arena, 4)
    ptr = b.data_ptr()
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        arena.dumps((b, lambda: None))
    assert arena._by_id[0].parent_loans == 0 and not arena._by_id[0].sent
    del b
    gc.collect()
    again = _batch(arena, 6)
    assert again.data_ptr() == ptr  # no parent loan was left counted
    got = _send(arena, again)  # and it still travels with its storage: the parent never got it
    assert torch.all(got == 6)


def test_blocks_the_child_drops_are_unmapped_by_the_parent(ends):
    arena, mirror = ends  # 2 batches of one tensor: 2 free blocks kept
    held = [_send(arena, _batch(arena, i)) for i in range(6)]
    assert len(mirror._blocks) == 6
    del held
    _tell_child(arena, mirror)  # 6 free blocks, 2 kept: 4 dropped
    assert arena.stats()["free"] == 2
    _send(arena, _batch(arena, 0))  # their ids ride with the next batch
    assert len(mirror._blocks) == 2


def test_only_plain_tensors_in_the_arena_travel_by_id(ends):
    arena, mirror = ends
    assert arena.reference(torch.zeros(3)) is None  # not arena memory: torch's reduction
    b = arena.take((4,), torch.float32)
    assert arena.reference(b.requires_grad_()) is None
    c = arena.take((4,), torch.complex64)
    c.fill_(1 + 2j)
    assert arena.reference(c.conj()) is None
    got = _send(arena, (torch.ones(3), c.conj()))  # still arrive (a copy in a block; torch's reduction,
    # which drops the conjugate bit, in DataLoader's workers too)
    assert torch.equal(got[0], torch.ones(3))
    assert torch.equal(got[1], ForkingPickler.loads(ForkingPickler.dumps(c.conj())))


def test_a_tensor_of_its_own_travels_as_a_copy_in_a_block_and_tensors_sharing_memory_still_share_it(ends):
    # Labels, samples made in __getitem__: torch's reduction would copy each
    # into a fresh shared-memory segment and pass its descriptor.
    arena, mirror = ends
    labels = torch.arange(4)
    data, refs = arena.dumps({"y": labels, "grid": labels.view(2, 2)})
    assert refs is not None and len({meta[0] for meta in refs[1]}) == 1  # one copy, in one block
    got = _receive(data, refs)
    assert got["y"].tolist() == [0, 1, 2, 3] and got["grid"].tolist() == [[0, 1], [2, 3]]
    assert got["y"].data_ptr() == got["grid"].data_ptr()  # they share memory there too
    labels.fill_(9)  # the child's tensor stays its own
    assert got["y"].tolist() == [0, 1, 2, 3] and not labels.is_shared()
    block = refs[1][0][0]
    del got
    _tell_child(arena, mirror)
    data, again = arena.dumps(torch.tensor([5, 6]))
    assert again[1][0][0] == block and again[3] is None  # its block, reused, by id
    assert _receive(data, again).tolist() == [5, 6]


def test_small_copies_of_one_result_share_a_block_and_each_goes_back_on_its_own(ends):
    # Each block holds a file descriptor in both processes: a result of many
    # small tensors (a detection batch's targets) must not take one each.
    arena, mirror = ends
    small = [torch.arange(i + 1, dtype=torch.float64) for i in range(50)]
    big = torch.arange(GRANULE, dtype=torch.uint8)  # a granule or more: a block of its own
    data, refs = arena.dumps({"targets": small, "big": big})
    assert len({meta[0] for meta in refs[1]}) == 2
    got = _receive(data, refs)
    assert all(torch.equal(g, t) for g, t in zip(got["targets"], small)) and torch.equal(got["big"], big)
    assert all(g.data_ptr() % 64 == 0 for g in got["targets"])
    slab = refs[1][0][0]
    kept = got["targets"][7]
    del got
    _tell_child(arena, mirror)
    assert arena._by_id[slab].parent_loans == 1  # one tensor of it is still held
    for _ in range(3):  # meanwhile other results never write over it
        _send(arena, [torch.full((100,), 9.0) for _ in range(20)])
        _tell_child(arena, mirror)
    assert kept.tolist() == list(range(8))
    del kept
    _tell_child(arena, mirror)
    assert arena._by_id[slab].parent_loans == 0


def _labels(arena: ChildArena, value: int) -> torch.Tensor:
    # default_collate's stack of 32 int labels: 256 bytes, cut from a shared block.
    t = arena.take((32,), torch.int64)
    t.fill_(value)
    return t


def _block_of(arena: ChildArena, t: torch.Tensor) -> int | None:
    block, _ = arena._holding(t.data_ptr())
    return None if block is None else block.id


def test_small_batch_buffers_of_a_thread_are_cut_from_one_block_until_it_is_full(ends):
    # A block each would hold a file descriptor each in both processes (a
    # dict sample of 50 keys: 50 per batch in flight).
    arena, mirror = ends
    per_block = GRANULE // 256
    held = [_send(arena, {"a": _labels(arena, i), "b": arena.take((3,), torch.uint8).fill_(i)})
            for i in range(per_block // 2)]
    assert len(mirror._blocks) == 1  # every batch so far: one block, sent once
    assert all(torch.all(h["a"] == i) and torch.all(h["b"] == i) for i, h in enumerate(held))
    assert len({h["a"].data_ptr() for h in held} | {h["b"].data_ptr() for h in held}) == per_block
    assert all(h["a"].data_ptr() % 64 == 0 and h["b"].data_ptr() % 64 == 0 for h in held)
    first = _labels(arena, 0)
    while _block_of(arena, _labels(arena, 0)) == _block_of(arena, first):
        pass
    assert len(arena._by_id) == 2  # full: the next buffers come from a new block


def test_a_shared_block_is_lent_again_only_once_every_batch_cut_from_it_is_let_go_of(ends):
    arena, mirror = ends
    kept = _send(arena, _labels(arena, 7))  # held by the parent
    block = _block_of(arena, _labels(arena, 0))
    for i in range(3 * GRANULE // 256):  # fill that block and two more; let every other batch go
        _send(arena, _labels(arena, i % 5))
        if i % 32 == 31:
            _tell_child(arena, mirror)
            assert torch.all(kept == 7), "a batch cut from a block was overwritten while the parent held it"
    assert arena._by_id[block].parent_loans == 1 and arena._by_id[block].parked
    del kept
    _tell_child(arena, mirror)
    free = [arena._holding(entry[1].__array_interface__["data"][0])[0].id for entry in arena._free]
    assert free[-1] == block and not arena._by_id[block].parked  # the next to be lent again


def test_each_worker_thread_cuts_from_its_own_block(ends):
    arena, mirror = ends
    mine = _labels(arena, 1)
    theirs = []
    thread = threading.Thread(target=lambda: theirs.append(_labels(arena, 2)))
    thread.start()
    thread.join()
    assert _block_of(arena, mine) != _block_of(arena, theirs[0])
    got = _send(arena, [mine, theirs[0]])
    assert got[0].tolist() == [1] * 32 and got[1].tolist() == [2] * 32


def test_a_block_that_could_not_be_received_is_lost_alone(ends):
    # A new image block whose descriptor fails to arrive: the labels' block,
    # mapped already, is not lost with it.
    arena, mirror = ends
    _send(arena, _labels(arena, 0))
    image, labels = arena.take((4, 48, 32, 3), torch.uint8).fill_(9), _labels(arena, 1)
    data, (token, metas, forget, storages) = arena.dumps((image, labels))
    with pytest.raises(Exception):
        loads(data, (token, metas, forget, b"not received"))
    _tell_child(arena, mirror)
    assert _block_of(arena, image) is None  # retired: never lent again
    slab = _block_of(arena, labels)
    assert slab is not None and arena._by_id[slab].parent_loans == 0
    data, refs = arena.dumps(_labels(arena, 2))
    assert refs[1][0][0] == slab and loads(data, refs).tolist() == [2] * 32


def test_a_lost_slab_fails_the_results_sent_from_it_then_is_left(ends):
    arena, mirror = ends
    first = _labels(arena, 1)
    slab = _block_of(arena, first)
    data, (token, metas, forget, storages) = arena.dumps(first)
    with pytest.raises(Exception):
        loads(data, (token, metas, forget, b"not received"))
    in_flight = arena.dumps(_labels(arena, 2))  # sent before the child hears of it: names the slab by id
    with pytest.raises(RuntimeError, match="lost with an earlier result"):
        _receive(*in_flight)
    _tell_child(arena, mirror)
    later = _labels(arena, 3)
    assert _block_of(arena, later) not in (None, slab)  # a new slab, the lost one left
    data, refs = arena.dumps(later)
    assert refs[1][0][0] == _block_of(arena, later) and loads(data, refs).tolist() == [3] * 32


def test_empty_batch_buffers_take_no_block(ends):
    # Boxes of images without annotations: (N, 0, 4). A block each would hold a descriptor each.
    arena, mirror = ends
    empties = [arena.take((8, 0, 4), torch.float32) for _ in range(3 * arena.max_blocks)]
    assert not arena._by_id
    got = _send(arena, empties)
    assert all(g.shape == (8, 0, 4) and g.dtype == torch.float32 for g in got)


def test_past_max_blocks_small_buffers_get_fresh_shared_memory_too(ends):
    arena, mirror = ends
    held = [_send(arena, _batch(arena, i)) for i in range(arena.max_blocks)]
    fresh = _labels(arena, 4)
    assert fresh.is_shared() and arena.reference(fresh) is None
    assert _send(arena, fresh).tolist() == [4] * 32
    del held


def test_small_copies_of_consecutive_results_share_the_threads_block_with_its_batch_buffers(ends):
    # Images and int labels (default_collate's torch.tensor(labels), a copy):
    # the labels' copies do not take a block per result.
    arena, mirror = ends
    results = [arena.dumps((_batch(arena, i), torch.arange(32) + i, _labels(arena, i))) for i in range(8)]
    slabs = {meta[0] for _, refs in results for meta in refs[1][1:]}
    assert len(slabs) == 1
    for i, (data, refs) in enumerate(results):
        image, copied, cut = loads(data, refs)
        assert torch.all(image == i) and copied.tolist() == list(range(i, i + 32)) and torch.all(cut == i)


def test_a_numpy_array_travels_as_a_copy_in_a_block_in_its_order(ends):
    # Pickled, it is copied into the pickle, through the pipe and out again.
    arena, mirror = ends
    c = np.arange(3000, dtype=np.int32).reshape(30, 100)  # 12 KB
    f = np.asfortranarray(c.astype(np.float32))
    strided = c[:, ::2]
    small, objects = np.arange(10), np.array([1, "a"], dtype=object)  # pickled by value
    # Pickled by value too: pickle decides its byte order (as for DataLoader's results).
    big_endian = c.astype(">i4")
    data, refs = arena.dumps({"c": c, "f": f, "strided": strided, "small": small, "objects": objects, "again": c,
                              "big_endian": big_endian})
    assert len(refs[1]) == 3
    got = _receive(data, refs)
    for key, sent in (("c", c), ("f", f), ("strided", strided)):
        assert np.array_equal(got[key], sent) and got[key].dtype == sent.dtype and got[key].shape == sent.shape
        assert got[key].flags.writeable and type(got[key]) is np.ndarray
    assert np.array_equal(got["big_endian"], c)
    assert got["big_endian"].dtype == ForkingPickler.loads(ForkingPickler.dumps(big_endian)).dtype
    assert got["f"].flags.f_contiguous and not got["f"].flags.c_contiguous and got["strided"].flags.c_contiguous
    assert got["again"] is got["c"]
    assert got["small"].tolist() == list(range(10)) and got["objects"].tolist() == [1, "a"]
    c[0, 0] = -1  # the parent's array is its own copy
    assert got["c"][0, 0] == 0
    block = refs[1][0][0]
    row = got["c"][3]
    del got
    _tell_child(arena, mirror)
    assert arena._by_id[block].parent_loans == 1  # the row keeps its array's loan
    del row
    _tell_child(arena, mirror)
    assert arena._by_id[block].parent_loans == 0


def test_an_unbatched_frame_arrives_with_its_pixels_in_a_block(ends):
    from threadloader import Frame

    arena, mirror = ends
    data, refs = arena.dumps(Frame(np.full((64, 48, 3), 7, np.uint8)))
    assert refs is not None and len(refs[1]) == 1
    frame = _receive(data, refs)
    assert isinstance(frame, Frame) and frame.shape == (64, 48, 3) and np.all(frame.numpy() == 7)


class _ArrayState:
    def __init__(self, k: int) -> None:
        self.k = k

    def __getstate__(self):
        return np.full(1000, self.k, dtype=np.float64)  # a temporary, 8 KB: copied into a block

    def __setstate__(self, state) -> None:
        self.state = state


class _TensorState(_ArrayState):
    def __getstate__(self):
        return torch.full((10,), float(self.k))  # a temporary tensor of its own


@pytest.mark.parametrize("kind", [_ArrayState, _TensorState])
def test_temporaries_made_while_pickling_each_arrive_as_themselves(ends, kind):
    # Freed before the next one was made, a temporary left that one its id
    # and its memory's address: it was sent as the first.
    arena, mirror = ends
    got = _send(arena, [kind(1), kind(2), kind(3)])
    assert [float(g.state[0]) for g in got] == [1.0, 2.0, 3.0]


def test_shared_tensors_and_views_of_larger_ones_keep_torchs_reduction(ends):
    arena, mirror = ends
    shared = torch.arange(6.0).share_memory_()  # no copy: the parent's tensor aliases it
    big = torch.arange(100.0)  # copying it whole for a view of two values could cost far more
    data, refs = arena.dumps((shared, big[10:12]))
    assert refs is None
    got = _receive(data, refs)
    assert torch.equal(got[0], shared) and got[0].is_shared() and got[1].tolist() == [10.0, 11.0]


def test_a_closed_mirror_rebuilds_nothing_and_its_loans_keep_their_memory():
    before = mirror_count()
    mirror = Mirror()
    arena = ChildArena(mirror.token, batches=2)
    got = _send(arena, _batch(arena, 9))
    data = arena.dumps(_batch(arena, 3))
    mirror.close()
    assert mirror_count() == before
    assert torch.all(got == 9)
    with pytest.raises(RuntimeError, match="loader that has stopped"):
        _receive(*data)


def test_past_max_blocks_held_batches_get_fresh_shared_memory(ends):
    # A training loop keeping every batch: each arena block holds a file
    # descriptor in the child too, so past max_blocks the child goes back to
    # DataLoader's way (fresh shared memory, its descriptor closed once sent).
    arena, mirror = ends
    held = [_send(arena, _batch(arena, i % 200)) for i in range(arena.max_blocks)]
    assert len(mirror._blocks) == arena.max_blocks
    fresh = _batch(arena, 3)
    assert fresh.is_shared() and arena.reference(fresh) is None
    got = _send(arena, fresh)
    assert torch.all(got == 3) and got.is_shared()
    assert all(torch.all(h == i % 200) for i, h in enumerate(held))
    del held[0]
    _tell_child(arena, mirror)
    assert not _batch(arena, 1).is_shared()  # a block is free again: the arena lends it


def test_free_blocks_kept_grow_with_the_tensors_a_result_holds(ends):
    # Images and masks: two blocks per batch, so twice the free blocks (and
    # the bound on blocks in use) for the same batches in circulation.
    arena, mirror = ends
    assert arena.slack == 2 and arena.max_blocks == 12
    _send(arena, [_batch(arena, 1), arena.take((4, 48, 32), torch.float32)])
    assert arena.slack == 4 and arena.max_blocks == 16
    held = [_send(arena, [_batch(arena, i), arena.take((4, 48, 32), torch.float32)]) for i in range(2)]
    del held
    _tell_child(arena, mirror)
    assert arena.stats()["free"] == 4  # (of 6) two batches' worth kept, not one's


def test_a_batch_let_go_of_after_close_goes_quietly(ends, capfd):
    arena, mirror = ends
    kept = _batch(arena, 1)
    _send(arena, _batch(arena, 2))
    arena.close()
    assert arena.stats()["free"] == 0
    del kept  # its weak reference's callback finds no block: no "Exception ignored" on stderr
    gc.collect()
    assert "Exception ignored" not in capfd.readouterr().err
