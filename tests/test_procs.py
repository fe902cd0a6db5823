"""worker_processes: the thread engine spread over child processes, same contract.

DataLoader (with forked worker processes where worker identity matters) is the
oracle. Every test also checks, through the ``no_leaks`` fixture, that no
child process, worker/receiver thread, open file descriptor or /dev/shm entry
outlives it.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import gc
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
import warnings
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from helpers import (
    Slow,
    Squares,
    no_sigchld_handler,
    open_fds,
    outcomes,
    to_list,
    wait_until,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from test_oracle import loader_args, materialize, run_epochs
from torch.utils.data import DataLoader, Dataset, default_collate, get_worker_info

from threadloader import ThreadDataLoader
from threadloader.worker import context as _context

FORK = "fork"


# Every test: no child process, thread, file descriptor or /dev/shm entry left behind.
pytestmark = pytest.mark.usefixtures("no_leaks")


# --- the same batches as DataLoader ----------------------------------------------------

@settings(max_examples=12)
@given(
    args=loader_args(),
    num_workers=st.integers(1, 4),
    data=st.data(),
    prefetch=st.integers(1, 3),
    persistent=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_same_batches_and_rng_as_dataloader(args, num_workers, data, prefetch, persistent, seed):
    n, kwargs, uses_generator, gen_seed = args
    processes = data.draw(st.integers(1, min(num_workers, 2)))
    dataset = Squares(n)
    oracle = dict(num_workers=1, persistent_workers=True, multiprocessing_context=FORK) if persistent else {}
    expected, rng_expected = run_epochs(
        DataLoader, dataset, 2, seed, **oracle, **materialize(kwargs, n, uses_generator, gen_seed))
    got, rng_got = run_epochs(
        ThreadDataLoader, dataset, 2, seed, num_workers=num_workers, worker_processes=processes,
        multiprocessing_context=FORK, prefetch_factor=prefetch, persistent_workers=persistent,
        **materialize(kwargs, n, uses_generator, gen_seed))
    assert got == expected
    assert torch.equal(rng_got, rng_expected), "global RNG consumed differently from DataLoader"


@settings(max_examples=8)
@given(n=st.integers(0, 30), batch_size=st.integers(1, 5), num_workers=st.integers(1, 3),
       drop_last=st.booleans(), seed=st.integers(0, 100))
def test_in_order_false_gives_the_same_multiset(n, batch_size, num_workers, drop_last, seed):
    dataset = Squares(n)
    kw = dict(batch_size=batch_size, shuffle=True, drop_last=drop_last)
    expected, _ = run_epochs(DataLoader, dataset, 1, seed, **kw)
    got, _ = run_epochs(ThreadDataLoader, dataset, 1, seed, num_workers=num_workers, in_order=False,
                        worker_processes=min(num_workers, 2), multiprocessing_context=FORK, **kw)
    assert collections.Counter(map(repr, got[0])) == collections.Counter(map(repr, expected[0]))


class WhoAmI(Dataset):
    """Reports, per index, the worker info and process seen, and whether worker_init_fn ran there."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.inited: set[int] = set()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        info = get_worker_info()
        return torch.tensor([i, info.id, info.num_workers, info.seed, os.getpid(), info.id in self.inited])


def _init(worker_id: int) -> None:
    info = get_worker_info()
    assert info.id == worker_id
    info.dataset.inited.add(worker_id)


def test_worker_info_global_ids_seeds_init_fn_and_placement():
    def rows(cls, **kw):
        g = torch.Generator().manual_seed(5)
        out = cls(WhoAmI(40), batch_size=2, shuffle=True, generator=g, num_workers=4, worker_init_fn=_init,
                  multiprocessing_context=FORK, **kw)
        return torch.cat(list(out)).tolist()

    ours, theirs = rows(ThreadDataLoader, worker_processes=2), rows(DataLoader)
    # index, worker id, num_workers and seed are DataLoader's; init ran in the worker's own process
    assert [r[:4] for r in ours] == [r[:4] for r in theirs]
    assert all(r[5] == 1 for r in ours)
    pid_of = {r[1]: r[4] for r in ours}
    assert os.getpid() not in pid_of.values()
    assert pid_of[0] == pid_of[2] != pid_of[1] == pid_of[3]  # worker w in process w % P


def _in_shared_memory(t: torch.Tensor) -> bool:
    """Whether ``t``'s memory lies in a shared-memory mapping of this process (/proc/self/maps)."""
    ptr = t.untyped_storage().data_ptr()
    with open("/proc/self/maps") as maps:
        for line in maps:
            lo, hi = (int(x, 16) for x in line.split(None, 1)[0].split("-"))
            if lo <= ptr < hi:
                return "/dev/shm/" in line
    return False


def _collate_reporting_shm(batch):
    out = default_collate(batch)
    return out, torch.tensor(_in_shared_memory(out[1])), torch.tensor(_context.batches_cross_processes())


def test_batches_are_built_in_shared_memory_in_the_child():
    loader = ThreadDataLoader(Squares(12), batch_size=4, num_workers=2, worker_processes=2,
                              collate_fn=_collate_reporting_shm, multiprocessing_context=FORK)
    for (indices, squares), shared_in_child, cross in loader:
        # Stacked into shared memory by default_collate in the child (a block
        # of its arena): sending it moved a block id, not the data, and the
        # parent reads it where the child wrote it.
        assert bool(shared_in_child) and bool(cross)
        assert _in_shared_memory(squares)
        assert squares.flatten().tolist() == [i * i for i in indices.tolist()]
    # Worker threads of this process still collate in private memory.
    threads = ThreadDataLoader(Squares(4), batch_size=4, num_workers=1, collate_fn=_collate_reporting_shm)
    (_, squares), shared, cross = next(iter(threads))
    assert not bool(shared) and not bool(cross) and not _in_shared_memory(squares)


class _BigFrames(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        from threadloader import Frame

        return Frame(np.full((32, 48, 3), i, np.uint8)), np.full((4, 1024), i, np.float32)


def _as_is(sample):
    return sample


@pytest.mark.parametrize("convert", [False, True])
def test_unbatched_frames_and_arrays_reach_the_parent_in_shared_memory(convert):
    # Pickled, their pixels would be copied into the pickle, through the pipe and out again.
    loader = ThreadDataLoader(_BigFrames(), batch_size=None, num_workers=2, worker_processes=2,
                              collate_fn=None if convert else _as_is, multiprocessing_context=FORK)
    for i, (frame, array) in enumerate(loader):
        # default_convert made the array a tensor (over the array's memory): it travels as a copy too
        assert type(array) is (torch.Tensor if convert else np.ndarray)
        array = torch.as_tensor(array)
        assert frame.shape == (32, 48, 3) and np.all(frame.numpy() == i) and torch.all(array == i)
        assert _in_shared_memory(torch.from_numpy(frame.numpy())) and _in_shared_memory(array)


class _OverlappingStorages(Dataset):
    """Two storages over one array, starting at the same address (``from_numpy`` of it and of its head)."""

    def __init__(self, head_first: bool) -> None:
        self.head_first = head_first

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int):
        array = np.arange(i, i + 1000, dtype=np.int64)  # 8 KB: a copy cut from the thread's slab
        head, full = torch.from_numpy(array[:10]), torch.from_numpy(array)
        return {"head": head, "full": full} if self.head_first else {"full": full, "head": head}


@pytest.mark.parametrize("head_first", [True, False])
def test_storages_starting_at_one_address_arrive_as_dataloaders_separate_copies(head_first):
    # The copies were looked up by address: the second storage reused the
    # first one's copy, reading past a 80-byte copy into the slab (memory of
    # later results), or aliasing two tensors DataLoader delivers apart.
    kwargs = dict(batch_size=None, num_workers=2)
    expected = list(DataLoader(_OverlappingStorages(head_first), **kwargs))
    held = []
    loader = ThreadDataLoader(_OverlappingStorages(head_first), worker_processes=1, multiprocessing_context=FORK,
                              **kwargs)
    for got, want in zip(loader, expected, strict=True):
        assert torch.equal(got["full"], want["full"]) and torch.equal(got["head"], want["head"])
        held.append(got)
    for got, want in zip(held, expected):  # nothing held was overwritten meanwhile
        assert torch.equal(got["full"], want["full"]) and torch.equal(got["head"], want["head"])
    got = held[0]
    got["full"][0] = -7  # two copies, as DataLoader's workers move each storage to shared memory of its own
    assert got["head"][0] == 0 and expected[0]["head"][0] == 0


class _NonNativeArrays(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return np.arange(i, i + (1024 if i % 2 == 0 else 16), dtype=">i4")  # 4 KB, 64 bytes


def test_non_native_byte_order_arrays_arrive_as_from_dataloaders_workers():
    # Pickle (DataLoader's way) may rebuild such an array in native order; the
    # arena kept '>i4' for arrays of 4 KB and more, so the dtype depended on the size.
    kwargs = dict(batch_size=None, num_workers=1, collate_fn=_as_is)
    expected = list(DataLoader(_NonNativeArrays(), multiprocessing_context=FORK, **kwargs))
    got = list(ThreadDataLoader(_NonNativeArrays(), worker_processes=1, multiprocessing_context=FORK, **kwargs))
    for a, b in zip(got, expected, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)


class _RowsAndLabels(Dataset):
    def __len__(self) -> int:
        return 120

    def __getitem__(self, i: int):
        return torch.full((1000,), i), i  # batches of 4: rows in a block of their own, labels cut from a slab


def _read_later(batch, out) -> None:
    time.sleep(1.0)  # the training loop goes on meanwhile
    out.send(to_list(batch))


@pytest.mark.parametrize("persistent", [False, True])
def test_a_batch_given_to_a_forked_process_is_never_overwritten(persistent):
    # Say a process started with fork to save a batch while training goes on:
    # it reads the batch through its own mapping of the arena's block, which
    # the child would have filled with a later batch once the loop let go.
    ctx = multiprocessing.get_context("fork")
    kwargs = dict(batch_size=4, num_workers=1, persistent_workers=persistent)
    expected = list(DataLoader(_RowsAndLabels(), **kwargs))
    receive, send = ctx.Pipe(duplex=False)
    loader = ThreadDataLoader(_RowsAndLabels(), worker_processes=1, multiprocessing_context=FORK, **kwargs)
    for epoch in range(2):
        it = iter(loader)
        first = next(it)
        saver = ctx.Process(target=_read_later, args=(first, send))
        saver.start()
        del first
        for i, batch in enumerate(it, start=1):
            assert to_list(batch) == to_list(expected[i])
            time.sleep(0.01)
        saved = receive.recv()
        saver.join()
        assert saved == to_list(expected[0]), epoch
    del it, loader


class _ManyKeys(Dataset):
    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int):
        sample = {f"f{k}": torch.tensor(i * 100.0 + k) for k in range(30)}
        sample.update({f"i{k}": i + k for k in range(10)})
        sample["a"] = np.full((3, 4), i, np.int16)
        sample.update({f"boxes{k}": torch.zeros(0, 4) for k in range(10)})  # no annotations: empty
        return sample


def test_a_sample_of_many_keys_gives_dataloaders_batches_in_a_few_blocks():
    # default_collate stacks each key into a batch buffer of its own: 51 per
    # batch here, cut from a few shared blocks (or, empty, in none) rather
    # than a block (and a file descriptor in each process) apiece.
    expected = list(DataLoader(_ManyKeys(), batch_size=8))
    before = len(open_fds())
    loader = ThreadDataLoader(_ManyKeys(), batch_size=8, num_workers=4, worker_processes=2, prefetch_factor=3,
                              multiprocessing_context=FORK)
    most = 0
    for got, want in zip(loader, expected, strict=True):
        most = max(most, len(open_fds()) - before)
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    # DataLoader's workers: 41 descriptors per batch held; a block each: as many again.
    assert most < 41, most


class _SlowToPickle:
    def __reduce__(self):
        time.sleep(0.5)
        return _SlowToPickle, ()


_CHUNK: dict[str, torch.Tensor] = {}
_CHUNK_LOCK = threading.Lock()


class _ViewsOfOneChunk(Dataset):
    """Views of one chunk, stacked by default_collate (in an arena block, in a child) once per process."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        with _CHUNK_LOCK:
            if "chunk" not in _CHUNK:
                _CHUNK["chunk"] = default_collate([torch.full((1000,), float(j)) for j in range(4)])
        chunk = _CHUNK["chunk"]
        if i == 2:
            time.sleep(0.1)
        return (chunk[i], _SlowToPickle()) if i == 0 else (chunk[i],)


def test_a_result_naming_a_block_by_id_never_overtakes_the_one_carrying_it():
    # Worker threads pickle their own results: the first to send a block
    # carries its storage; another thread's result naming it by id alone,
    # pickled after it but quicker, was queued first and found it unknown.
    _CHUNK.clear()
    kwargs = dict(batch_size=None, num_workers=4, multiprocessing_context=FORK, timeout=20)
    expected = [r[0][0].item() for r in DataLoader(_ViewsOfOneChunk(), **kwargs)]
    got = [r[0][0].item() for r in ThreadDataLoader(_ViewsOfOneChunk(), worker_processes=2, **kwargs)]
    assert got == expected == [0.0, 1.0, 2.0, 3.0]


class _PipeSized(Dataset):
    """Results that do not travel in the arena, some bigger than a pipe holds (64 KiB on Linux)."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> dict:
        size = (3 << 16) + i if i % 3 == 0 else 100 + i
        return {"i": i, "blob": bytes([i]) * size, "array": np.full(i + 1, i, dtype=np.int64)}


@pytest.mark.parametrize("in_order", [True, False])
def test_results_bigger_than_the_pipe_from_two_threads_of_a_child_arrive_whole(in_order):
    # Both worker threads of one child write to its one result pipe; what a
    # full pipe does not take waits in the child until the training loop,
    # slow to read, makes room.
    kwargs = dict(batch_size=None, num_workers=2, multiprocessing_context=FORK, timeout=30, in_order=in_order)

    def read_slowly(loader):
        out = []
        for k, r in enumerate(loader):
            if k < 3:
                time.sleep(0.2)
            out.append((r["i"], r["blob"], r["array"].tolist()))
        return out

    got = read_slowly(ThreadDataLoader(_PipeSized(), worker_processes=1, **kwargs))
    expected = read_slowly(DataLoader(_PipeSized(), **kwargs))
    if not in_order:
        got, expected = sorted(got), sorted(expected)
    assert got == expected
    assert all(len(blob) == ((3 << 16) + i if i % 3 == 0 else 100 + i) for i, blob, _ in got)


# --- arguments ----------------------------------------------------------------------------

@pytest.mark.parametrize("value,num_workers,match", [
    (-1, 2, "worker_processes option should be non-negative"),
    (1.0, 2, "worker_processes option should be an int"),
    (True, 2, "worker_processes option should be an int"),
    (3, 2, "worker_processes option should be at most num_workers"),
    (1, 0, "worker_processes option could only be specified with worker threads"),
])
def test_bad_worker_processes_raise_one_line_value_errors(value, num_workers, match):
    with pytest.raises(ValueError, match=match) as info:
        ThreadDataLoader(Squares(4), num_workers=num_workers, worker_processes=value)
    assert "\n" not in str(info.value)


def test_numpy_integer_worker_processes_accepted_as_dataloader_accepts_num_workers():
    loader = ThreadDataLoader(Squares(6), batch_size=2, num_workers=np.int64(2), worker_processes=np.int64(2),
                              multiprocessing_context=FORK)
    assert to_list(loader) == to_list(DataLoader(Squares(6), batch_size=2, num_workers=np.int64(2)))
    with pytest.raises(ValueError, match="worker_processes option should be an int"):
        ThreadDataLoader(Squares(6), num_workers=2, worker_processes=np.bool_(True))


# --- errors, timeout --------------------------------------------------------------------

def test_killed_worker_process_raises_once_then_the_others_go_on():
    it = iter(ThreadDataLoader(Slow(100, 0.02), num_workers=4, worker_processes=2, multiprocessing_context=FORK))
    got = [int(next(it))]
    victim = it._pool.pids[1]  # workers 1 and 3
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=rf"^DataLoader worker \(pid\(s\) {victim}\) exited unexpectedly"):
        for x in it:
            got.append(int(x))
    got += [int(x) for x in it]  # one error for the process, as for a DataLoader worker process; no hang
    assert got == sorted(set(got))
    # Only the dead process's undone tasks (at most prefetch_factor per worker) are missing.
    assert got[-1] == 99 and len(got) >= 100 - 2 * 2 - 2
    del it


class _ExitsAt1(Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> int:
        if i == 1:
            os._exit(1)
        return i


_PROCESS_DEATH = r"^DataLoader worker \(pid\(s\) \d+\) exited unexpectedly"


@functools.cache
def _dataloader_outcomes_when_a_worker_exits() -> tuple:
    """DataLoader's outcomes over ``_ExitsAt1``: taken once, as it waits out its status check (seconds)."""
    with no_sigchld_handler():  # its raise could land inside next() and lose a batch
        return tuple(outcomes(DataLoader(_ExitsAt1(), batch_size=None, num_workers=2), death=_PROCESS_DEATH))


def test_a_worker_process_exiting_is_raised_where_dataloader_raises_it():
    expected = list(_dataloader_outcomes_when_a_worker_exits())
    got = outcomes(ThreadDataLoader(_ExitsAt1(), batch_size=None, num_workers=2, worker_processes=2,
                                    multiprocessing_context=FORK), death=_PROCESS_DEATH)
    assert expected == [0, "exited", 2, 4, 5, "StopIteration"]
    assert got == expected


DIES_IN_A_WORKER = textwrap.dedent(
    """
    import json, os, re, signal, sys
    from torch.utils.data import DataLoader, Dataset
    from threadloader import ThreadDataLoader

    how, kind = sys.argv[1], sys.argv[2]

    class Dies(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            if i == 1:
                if how == "exit":
                    os._exit(3)
                os.kill(os.getpid(), getattr(signal, how))
            return i

    kwargs = dict(batch_size=None, num_workers=2, multiprocessing_context="fork")
    if kind == "DataLoader":
        loader = DataLoader(Dies(), **kwargs)
    else:
        loader = ThreadDataLoader(Dies(), worker_processes=2, **kwargs)
    try:
        list(loader)
    except RuntimeError as e:
        pids = lambda text: re.sub(r"pid(\\(s\\))? \\d+", r"pid\\1 N", str(text))
        print(json.dumps([pids(e), pids(e.__cause__)]))
    """
)


#: What DataLoader says (its error, the cause, its worker's line on stderr) for each death below.
DATALOADER_SAYS = {
    "SIGBUS": (["DataLoader worker (pid(s) N) exited unexpectedly",
                "DataLoader worker (pid N) is killed by signal: Bus error. It is possible that dataloader's workers "
                "are out of shared memory. Please try to raise your shared memory limit."],
               ["ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared "
                "memory (shm)."]),
    "exit": (["DataLoader worker (pid(s) N) exited unexpectedly",
              "DataLoader worker (pid N) exited unexpectedly with exit code 3. Details are lost due to "
              "multiprocessing. Rerunning with num_workers=0 may give better error trace."], []),
}


@pytest.mark.parametrize("how", ["SIGBUS", "exit"])
def test_a_crashed_worker_process_is_reported_in_dataloaders_words(how):
    # DataLoader's error, its cause in the words of torch's check of its
    # workers (a bus error's shared-memory hint, an exit code), and the line
    # torch's handler prints on stderr in the worker.
    def run(kind):
        out = subprocess.run([sys.executable, "-c", DIES_IN_A_WORKER, how, kind], capture_output=True, text=True,
                             timeout=60)
        assert out.stdout, out.stderr
        return json.loads(out.stdout), [line for line in out.stderr.splitlines() if line.startswith("ERROR:")]

    got = run("ThreadDataLoader")
    assert got == DATALOADER_SAYS[how]
    try:
        (error, cause), stderr = run("DataLoader")
    except subprocess.TimeoutExpired:
        # DataLoader itself now and then hangs here (its SIGCHLD handler's
        # raise lost; seen on free-threaded 3.13t): the words above are its own.
        return
    if cause == "None":
        # Its SIGCHLD handler raised outside its queue wait: the detail comes
        # bare, not as the cause of "exited unexpectedly" (timing).
        error, cause = got[0][0], error
    if cause == "":
        # Its periodic check of the workers found the dead one after a wait
        # timed out: the cause is that wait's queue.Empty, which has no words
        # (timing; torch 2.13.0 in CI).
        cause = got[0][1]
    assert got == ([error, cause], stderr)


def test_a_program_a_worker_process_runs_can_be_interrupted():
    # The children do not die of Ctrl-C (the parent handles it), but an
    # ignored SIGINT would stay ignored in every program they exec.
    class ChildSigIgn(Dataset):
        def __len__(self) -> int:
            return 1

        def __getitem__(self, i: int) -> str:
            status = subprocess.run(["cat", "/proc/self/status"], capture_output=True, text=True).stdout
            return next(line for line in status.splitlines() if line.startswith("SigIgn:"))

    if not os.path.exists("/proc/self/status"):
        pytest.skip("needs Linux's /proc")
    kwargs = dict(batch_size=None, num_workers=1, multiprocessing_context=FORK)
    got = list(ThreadDataLoader(ChildSigIgn(), worker_processes=1, **kwargs))
    assert not int(got[0].split()[1], 16) & (1 << (signal.SIGINT - 1))
    assert got == list(DataLoader(ChildSigIgn(), **kwargs))


def test_persistent_loader_raises_the_crash_again_next_epoch():
    loader = ThreadDataLoader(Slow(20, 0.01), batch_size=2, num_workers=2, worker_processes=2,
                              persistent_workers=True, multiprocessing_context=FORK)
    list(loader)
    victim = loader._iterator._pool.pids[1]
    os.kill(victim, signal.SIGKILL)
    message = rf"^DataLoader worker \(pid\(s\) {victim}\) exited unexpectedly$"
    cause = f"DataLoader worker (pid {victim}) is killed by signal: Killed. "
    with pytest.raises(RuntimeError, match=message) as info:
        list(loader)
    assert str(info.value.__cause__) == cause
    for _ in range(2):  # as DataLoader's next epochs: the same error, never one of a closed queue
        with pytest.raises(RuntimeError, match=message) as info:
            list(loader)
        assert str(info.value.__cause__) == cause
    del loader


def test_a_persistent_loaders_next_epoch_names_every_dead_worker_process_as_dataloader_does():
    # The test's join() reaps the children while their receivers poll them:
    # a receiver must still see its child's death, not a broken channel.
    loader = ThreadDataLoader(Slow(20, 0.01), batch_size=2, num_workers=4, worker_processes=2,
                              persistent_workers=True, multiprocessing_context=FORK)
    list(loader)
    processes = loader._iterator._workers
    victims = loader._iterator._pool.pids
    for pid in reversed(victims):
        os.kill(pid, signal.SIGKILL)
    for process in processes:
        process.join(timeout=10)
    del processes
    message = rf"^DataLoader worker \(pid\(s\) {victims[0]}, {victims[1]}\) exited unexpectedly$"
    for _ in range(2):
        with pytest.raises(RuntimeError, match=message):
            list(loader)
    del loader


def test_a_child_reaped_by_someone_else_is_still_seen_dead(monkeypatch):
    # multiprocessing's exitcode reads None for a process that another thread
    # (or os.waitpid) reaped: the receiver took its death for a broken pipe.
    from threadloader.procs import process_pool as pool_module

    monkeypatch.setattr(pool_module, "EXIT_CODE_WAIT_S", 0.05)
    process = multiprocessing.get_context(FORK).Process(target=time.sleep, args=(60,), daemon=True)
    process.start()
    child = types.SimpleNamespace(process=process)  # what _exited reads of a pool's child
    assert not pool_module._exited(child, timeout=0.0)
    os.kill(process.pid, signal.SIGKILL)
    os.waitpid(process.pid, 0)  # reaped outside multiprocessing
    assert process.exitcode is None  # what multiprocessing still says
    assert pool_module._exited(child, timeout=0.0)
    assert pool_module._exit_code(child) is None
    assert pool_module._crash_message(process.pid, None) == f"DataLoader worker (pid {process.pid}) exited unexpectedly."
    process._popen.returncode = -signal.SIGKILL  # what its reaper would have set: close() frees its sentinel
    process.close()


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")  # the writer thread ends quietly
def test_a_pool_stopped_on_the_thread_that_writes_a_childs_jobs_does_not_wait_for_that_child(monkeypatch):
    # A garbage collection can run a dropped iterator's stop() on the thread
    # that writes a child's backlog of jobs: the None telling that child to
    # stop would leave only after stop() returned, and stop() waited out the
    # children's budget for it.
    from threadloader.procs import process_pool as pool_module
    from threadloader.procs.wire import NEW_EPOCH

    monkeypatch.setattr(pool_module, "JOIN_BUDGET_S", 60.0)
    it = iter(ThreadDataLoader(Squares(8), batch_size=2, num_workers=1, worker_processes=1,
                               multiprocessing_context=FORK))
    next(it)
    pool = it._pool
    to_stop = [pool]  # emptied when used: nothing else holds the pool once the test ends
    took: list[float] = []
    child = pool._children[0]
    drain = child.jobs._drain

    def stops_the_pool_first():  # runs on the writer thread, as a collection there would
        start = time.monotonic()
        stopped = to_stop.pop()
        stopped.stop()
        took.append(time.monotonic() - start)
        drain()

    child.jobs._drain = stops_the_pool_first
    # More than a pipe holds: the rest waits for the writer thread, and the None behind it.
    child.jobs.put((NEW_EPOCH, (pool.generation, b"x" * (8 << 20))))
    assert child.jobs.writer_thread is not None
    deadline = time.monotonic() + 120
    while not took and time.monotonic() < deadline:
        time.sleep(0.05)
    assert took and took[0] < 30  # not the 61 s budget
    assert not child.process.is_alive()
    del it, pool, child


def test_workers_keep_answering_after_the_iterator_stops():
    def states(cls, **kw):
        it = iter(cls(Squares(6), batch_size=2, num_workers=2, multiprocessing_context=FORK, **kw))
        list(it)
        workers = it._workers
        for w in workers:
            w.join(5)
        return [(w.is_alive(), w.exitcode, isinstance(w.pid, int)) for w in workers]

    assert states(ThreadDataLoader, worker_processes=2) == states(DataLoader) == [(False, 0, True)] * 2


def _refuse_rebuild(x: int) -> None:
    raise ValueError(f"cannot rebuild {x}")


class Unreceivable:
    """Pickles in the worker, but cannot be unpickled (e.g. fds ran out receiving a tensor)."""

    def __init__(self, x: int) -> None:
        self.x = x

    def __reduce__(self):
        return _refuse_rebuild, (self.x,)


class Odd(Dataset):
    """``make(i)`` at index ``at``, plain ints elsewhere."""

    def __init__(self, n: int, at: int, make) -> None:
        self.n, self.at, self.make = n, at, make

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return self.make(i) if i == self.at else i


def test_result_that_cannot_be_received_raises_its_error_and_the_iterator_goes_on():
    it = iter(ThreadDataLoader(Odd(5, 1, Unreceivable), batch_size=None, num_workers=2, worker_processes=2,
                               timeout=10, multiprocessing_context=FORK))
    pids = it._pool.pids
    assert next(it) == 0
    # DataLoader re-raises the unpickling error itself, and its worker lives on.
    with pytest.raises(ValueError) as info:
        next(it)
    assert str(info.value) == "cannot rebuild 1"
    if sys.version_info >= (3, 11):  # a note says where it happened
        assert "receiving a result from DataLoader worker process" in info.value.__notes__[0]
    assert all(p.is_alive() for p in it._workers) and it._pool.pids == pids
    assert list(it) == [2, 3, 4]


_TRAVELS: list[tuple[str, str]] = []


def _unpickled(i: int, pickled_by: str) -> int:
    _TRAVELS.append((pickled_by, threading.current_thread().name))
    return i


class _SaysWhereItTravels:
    def __init__(self, i: int) -> None:
        self.i = i

    def __reduce__(self):
        return _unpickled, (self.i, threading.current_thread().name)


class _Travellers(Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int):
        return _SaysWhereItTravels(i)


def test_results_are_pickled_by_their_worker_thread_and_unpickled_by_the_thread_that_takes_them():
    # On a free-threaded build an object is freed by the thread that made it:
    # a batch a worker thread made and the queue's feeder thread let go of
    # (in the child), or a receiver made and the loop let go of (here),
    # stayed until that thread ran again, and so did its arena block (CI's 3.13t run).
    _TRAVELS.clear()
    loader = ThreadDataLoader(_Travellers(), batch_size=None, num_workers=2, worker_processes=2,
                              multiprocessing_context=FORK)
    assert list(loader) == list(range(6))
    assert {pickled_by for pickled_by, _ in _TRAVELS} <= {"threadloader-worker-0", "threadloader-worker-1"}
    assert [unpickled_by for _, unpickled_by in _TRAVELS] == [threading.current_thread().name] * 6


def _local_function(i: int):
    return lambda: i  # cannot be pickled


def test_result_that_cannot_be_sent_raises_instead_of_hanging():
    # DataLoader's worker queue drops it (printing the error) and the loader waits for it forever.
    it = iter(ThreadDataLoader(Odd(4, 2, _local_function), batch_size=None, num_workers=2, worker_processes=2,
                               timeout=10, multiprocessing_context=FORK))
    assert [next(it), next(it)] == [0, 1]
    with pytest.raises(AttributeError, match="Can't (pickle|get) local object") as info:
        next(it)
    assert "sending its result" in str(info.value)
    assert list(it) == [3]


# --- shutdown on every exit path -----------------------------------------------------------

    # the fixture checks processes, threads, fds and /dev/shm


def test_persistent_workers_keep_their_processes_across_epochs():
    loader = ThreadDataLoader(Squares(10), batch_size=3, num_workers=2, worker_processes=2, persistent_workers=True,
                              multiprocessing_context=FORK)
    list(loader)
    pids = loader._iterator._pool.pids
    assert to_list(loader) == to_list(DataLoader(Squares(10), batch_size=3))
    assert loader._iterator._pool.pids == pids and all(psutil.pid_exists(p) for p in pids)
    del loader


CHILD = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {tests!r})  # Slow must be importable by spawned and forkserver children
    from helpers import Slow
    from threadloader import ThreadDataLoader

    loader = ThreadDataLoader(Slow(10**6, 0.01), batch_size=2, num_workers=2, worker_processes=2,
                              persistent_workers=True, multiprocessing_context={context!r})
    it = iter(loader)
    next(it)
    if {mode!r} == "loop":
        # Armed before the pids go out: a Ctrl-C that lands inside an import's
        # weakref callback is swallowed by Python, and the loop would never end.
        import faulthandler
        faulthandler.dump_traceback_later(25, exit=True)  # a hang shows where each thread is
    try:  # the parent may interrupt as soon as it has read the pids
        print(" ".join(map(str, it._pool.pids)), flush=True)
        if {mode!r} == "sleep":
            time.sleep(60)
        elif {mode!r} == "loop":
            for _ in it:
                pass
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        raise
    """
)


def _gone(pids: list[int]) -> bool:
    def dead(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    return all(dead(p) for p in pids)


def _spawn(mode: str, tmp: Path, context: str | None = None) -> tuple[subprocess.Popen, list[int]]:
    script = CHILD.format(mode=mode, context=context, tests=os.path.dirname(os.path.abspath(__file__)))
    # TMPDIR: a killed process leaves its multiprocessing temp directory behind.
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONUNBUFFERED="1", TMPDIR=str(tmp)))
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2, proc.stderr.read() if proc.poll() is not None else pids
    return proc, pids


@pytest.mark.parametrize("context", [None, "forkserver"])
def test_children_exit_when_the_parent_is_killed(context, tmp_path):
    # Under forkserver the children's parent is the forkserver, not the killed process.
    proc, pids = _spawn("sleep", tmp_path, context)
    try:
        proc.kill()
        proc.wait(timeout=5)
        assert wait_until(lambda: _gone(pids), timeout=5), "worker processes outlived their killed parent"
    finally:
        proc.kill()
        _terminate(pids)  # orphans (when the test fails) hold the pipes communicate() reads to EOF
        proc.communicate(timeout=10)


def _terminate(pids: list[int]) -> None:
    for pid in pids:
        try:
            psutil.Process(pid).terminate()
        except psutil.NoSuchProcess:
            pass


def test_ctrl_c_and_interpreter_exit_stop_the_children(tmp_path):
    proc, pids = _spawn("loop", tmp_path)
    try:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)  # the child's faulthandler dumps its threads at 25 s
    except subprocess.TimeoutExpired:
        proc.kill()
        _terminate(pids)  # orphans hold the pipes communicate() reads to EOF
        out, err = proc.communicate(timeout=10)
        pytest.fail(f"no exit 30 s after Ctrl-C; its stderr:\n{err[-6000:]}")
    finally:
        proc.kill()
    assert "Timeout (" not in err, f"hung after Ctrl-C (faulthandler's dump):\n{err[-6000:]}"
    assert "interrupted" in out and "KeyboardInterrupt" in err, err[-3000:]
    assert wait_until(lambda: _gone(pids), timeout=5)
    proc, pids = _spawn("exit", tmp_path)  # persistent workers alive at interpreter exit
    try:
        _, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert wait_until(lambda: _gone(pids), timeout=5)


FORKED_COPY = textwrap.dedent(
    """
    import multiprocessing, sys
    from threadloader import ThreadDataLoader

    holder = [iter(ThreadDataLoader(list(range(40)), batch_size=2, num_workers=2, worker_processes=2,
                                    multiprocessing_context="fork"))]
    first = next(holder[0])

    def drop_the_copy():  # the forked copy of the iterator is freed here, in the child
        holder.clear()

    child = multiprocessing.get_context("fork").Process(target=drop_the_copy)
    child.start()
    child.join()
    print(1 + sum(1 for _ in holder[0]), child.exitcode)
    """
)


def test_a_forked_copy_freed_in_a_child_leaves_the_owners_workers_alone():
    # A forked child frees its copy of a live iterator: the copy must not stop
    # the owner's worker processes (their epoch goes on), nor try to join them.
    proc = subprocess.run([sys.executable, "-c", FORKED_COPY], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["20", "0"], proc.stderr
    assert "can only join a child process" not in proc.stderr


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("module,name", [
    ("threadloader.images.frames", "_publish_lock"),  # held by worker threads as they publish resized frames
    ("threadloader.worker.intraop", "_lock"),
    ("threadloader.worker.rng", "_lock"),
    ("threadloader._platform.torch_compat", "_install_lock"),
    ("threadloader.images._turbojpeg", "_lock"),
    ("threadloader.integrations.accelerate", "_swap_lock"),  # held while Accelerate's prepare() runs
])
def test_a_child_forked_while_another_thread_holds_a_module_lock_starts_with_it_free(module, name):
    # A fork copies a lock held by another thread as held, and only the forking
    # thread exists in the child: its first use there waited for ever (a
    # worker_processes loader started with fork while another loader's
    # threads ran).
    import importlib

    lock = getattr(importlib.import_module(module), name)
    with lock:
        pid = os.fork()
        if pid == 0:  # the child: exit at once, whatever happens
            os._exit(0 if getattr(sys.modules[module], name).acquire(timeout=5) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("copied", [False, True])
def test_a_child_forked_while_a_loaders_stats_lock_is_held_can_use_its_stats(copied):
    # Each loader's stats hold their own lock (a snapshot from any thread
    # against the consumer's new epoch): a fork while it was held left the
    # child's copy of the loader hanging at its next iter().
    import copy

    loader = ThreadDataLoader(Squares(4), batch_size=2, num_workers=1)
    list(loader)
    if copied:  # Lightning and Accelerate copy loaders, stats and all
        loader = copy.deepcopy(loader)
    stats = loader.stats()
    with stats._epoch_lock:
        pid = os.fork()
        if pid == 0:
            ok = loader.stats()._epoch_lock.acquire(timeout=5)
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def _holds_write_end(pid: int, pipe: str) -> bool:
    """Whether process ``pid`` has ``pipe`` (``pipe:[inode]``) open for writing."""
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):
            if os.readlink(f"/proc/{pid}/fd/{fd}") == pipe:
                with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                    flags = int(info.read().split("flags:")[1].split()[0], 8)
                if flags & 3 == os.O_WRONLY:
                    return True
    return False


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_pools_started_at_once_from_two_threads_keep_their_result_pipes_apart():
    # A child of one pool forked while another pool's result pipe was still
    # open for writing in the parent kept it: that other child's receiver then
    # waited for ever on a message cut short by its child's death (no end of
    # file), and the consumer hung. Seen in 8 of 30 concurrent starts.
    from threadloader.engine.protocol import WorkerConfig
    from threadloader.procs import ProcessPool

    cfg = WorkerConfig(dataset=list(range(4)), kind=0, auto_collation=False, collate_fn=lambda x: x, drop_last=False,
                  base_seed=0, init_fn=None, num_workers=1, pin=False, pin_device=None, device_index=None)
    for _ in range(12):
        pools: dict[str, ProcessPool] = {}
        barrier = threading.Barrier(2)

        def start(name: str) -> None:
            barrier.wait()
            pools[name] = ProcessPool(cfg, 1, multiprocessing.get_context("fork"))

        threads = [threading.Thread(target=start, args=(name,)) for name in "AB"]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        try:
            for me, other in ("AB", "BA"):
                pipe = os.readlink(f"/proc/self/fd/{pools[me]._children[0].results.reader.fileno()}")
                assert not _holds_write_end(pools[other].pids[0], pipe), f"pool {other}'s child holds {me}'s pipe"
        finally:
            for pool in pools.values():
                pool.stop()


@pytest.mark.skipif(not hasattr(os, "fork") or not os.path.isdir("/proc/self/fd"), reason="needs fork and /proc")
def test_a_private_pipe_end_reaches_only_its_owners_forked_child():
    from threadloader._platform import fork as _fork

    read_end, write_end = os.pipe()
    pipe = os.readlink(f"/proc/self/fd/{write_end}")

    def forked_child_sees() -> str:
        pid = os.fork()
        if pid == 0:
            seen = os.readlink(f"/proc/self/fd/{write_end}")
            os._exit(0 if seen == pipe else 1 if seen == os.devnull else 2)
        _, status = os.waitpid(pid, 0)
        return {0: "pipe", 1: "devnull"}.get(os.waitstatus_to_exitcode(status), "?")

    owner = object()
    try:
        _fork.private_fd(write_end, owner)
        assert forked_child_sees() == "devnull"  # any other fork: a thread's os.fork, a DataLoader
        with _fork.forking_for(owner):
            assert forked_child_sees() == "pipe"  # the owner's own child
        _fork.release_private_fd(write_end)
        assert forked_child_sees() == "pipe"
    finally:
        _fork.release_private_fd(write_end)
        os.close(read_end)
        os.close(write_end)


# --- resume, stats, pinning ---------------------------------------------------------------

def test_stats_count_the_childrens_work():
    loader = ThreadDataLoader(Slow(24, 0.002), batch_size=4, num_workers=2, worker_processes=2,
                              multiprocessing_context=FORK)
    list(loader)
    snap = loader.stats().snapshot()
    assert snap["batches"] == 6 and snap["items"] == 24 and snap["items_fetched"] == 24
    assert snap["fetch_s"] >= 24 * 0.002 * 0.9
    assert 0 < snap["worker_utilization"] <= 1


def test_finished_loaders_kept_hold_no_shared_memory():
    # One loader per shard or validation set, kept for later epochs: each
    # keeps its stats, which must not keep the pool's shared counters (an fd).
    def open_fds():
        gc.collect()
        return len(os.listdir("/proc/self/fd"))

    def finished():
        loader = ThreadDataLoader(Squares(8), batch_size=4, num_workers=2, worker_processes=1,
                                  multiprocessing_context=FORK)
        assert len(list(loader)) == 2
        return loader

    finished()  # what the first pool opens for good (multiprocessing's helpers)
    before = open_fds()
    kept = [finished() for _ in range(8)]
    assert open_fds() - before < 4
    snap = kept[-1].stats().snapshot()
    assert snap["items_fetched"] == 8 and snap["batches"] == 2  # still readable


FD_LIMIT_CHILD = textwrap.dedent(
    """
    import resource, sys, torch
    from torch.utils.data import DataLoader, IterableDataset
    from threadloader import ThreadDataLoader

    # 32 KiB each: batch buffers this large take a block each (smaller ones
    # share blocks and do not run out here, see the test after this one).
    shape = (64, 128) if sys.argv[2] == "large" else (2, 2)

    class Tensors(IterableDataset):
        def __iter__(self):
            return (torch.randn(*shape) for _ in range(200))

    cls, kw = (ThreadDataLoader, {"worker_processes": 1}) if sys.argv[1] == "procs" else (DataLoader, {})
    keep = []  # each received tensor holds a descriptor
    resource.setrlimit(resource.RLIMIT_NOFILE, (100, 100))
    try:
        for t in cls(Tensors(), num_workers=1, multiprocessing_context="fork", **kw):
            keep.append(t)
        print("no error")
    except RuntimeError as e:
        print(f"RuntimeError: {e}")
    """
)


def test_running_out_of_file_descriptors_gives_dataloaders_advice():
    # torch's test_fd_limit_exceeded: not the unpickler's "received 0 items of ancdata".
    ours, theirs = _fd_limit_last_line("procs", "large"), _fd_limit_last_line("torch", "large")
    assert ours == theirs and theirs.startswith("RuntimeError: Too many open files. ") and "ulimit -n" in ours


def test_small_batches_kept_share_blocks_and_do_not_run_out_of_file_descriptors():
    # torch's test_fd_limit_exceeded as it is (200 kept batches of 2x2 under a
    # limit of 100 descriptors): DataLoader runs out; packed into shared
    # blocks, the same batches hold a descriptor per 64 KiB.
    assert _fd_limit_last_line("torch", "small").startswith("RuntimeError: Too many open files. ")
    assert _fd_limit_last_line("procs", "small") == "no error"


def _fd_limit_last_line(which: str, size: str) -> str:
    out = subprocess.run([sys.executable, "-c", FD_LIMIT_CHILD, which, size], capture_output=True, text=True,
                         timeout=120)
    return (out.stdout.strip().splitlines() or [out.stderr[-500:]])[-1]


KILLED_MID_WRITE_CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    from torch.utils.data import Dataset
    from threadloader import ThreadDataLoader

    write, cut = os.write, []

    def part_then(fd, buf):
        # What the OOM killer does to a process writing a large result: part of it is in the pipe.
        if len(buf) > (1 << 20) and not cut:
            cut.append(fd)
            sent = write(fd, bytes(buf[:4096]))
            if sys.argv[1] == "killed":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(8)  # "break": a slow write, cut short when the child exits on stop()
            return sent
        return write(fd, buf)

    class Data(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            os.write = part_then  # in the worker process only
            if i == 0 and sys.argv[1] == "killed":
                time.sleep(0.5)  # the death comes first; "break" breaks at once, mid-write
            return b"x" * (8 << 20) if i == 1 else b"small"

    loader = ThreadDataLoader(Data(), batch_size=1, num_workers=2, worker_processes=2,
                              multiprocessing_context="fork", collate_fn=lambda b: b[0])
    try:
        for batch in loader:
            if sys.argv[1] == "break":
                break
        print("ended")
    except RuntimeError as e:
        print("error:", e)
    """
)


@pytest.mark.parametrize("how", ["killed", "break"])
def test_a_child_gone_in_the_middle_of_writing_a_result_hangs_nothing(how):
    # The receiver reading the cut message gets an end of file: the parent
    # keeps no copy of the pipe's write end, so it cannot wait for ever.
    out = subprocess.run([sys.executable, "-c", KILLED_MID_WRITE_CHILD, how], capture_output=True, text=True,
                         timeout=60)
    last = (out.stdout.strip().splitlines() or [out.stderr[-500:]])[-1]
    if how == "killed":
        assert re.match(r"error: DataLoader worker \(pid\(s\) \d+\) exited unexpectedly$", last), last
    else:
        assert last == "ended"


def test_spawn_start_method():
    loader = ThreadDataLoader(Squares(10), batch_size=3, num_workers=2, worker_processes=1,
                              multiprocessing_context="spawn")
    assert to_list(loader) == to_list(DataLoader(Squares(10), batch_size=3))


def test_forkserver_start_method():
    def batches(cls, **kw):
        return to_list(cls(Squares(10), batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(1),
                           num_workers=2, multiprocessing_context="forkserver", **kw))

    assert batches(ThreadDataLoader, worker_processes=2) == batches(DataLoader)


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_unpicklable_arguments_warn_as_dataloader(context):
    def attempt(cls, **kw):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(AttributeError, match="Can't (pickle|get) local object"):
                list(cls(Squares(4), num_workers=2, collate_fn=lambda b: b, multiprocessing_context=context, **kw))
        return [w for w in caught if "Got pickle error" in str(w.message)]

    ours, theirs = attempt(ThreadDataLoader, worker_processes=2), attempt(DataLoader)
    # Attributed to torch's module, so filterwarnings(module="torch.utils.data.dataloader") takes both.
    assert ([(str(w.message), w.category, w.filename, w.lineno) for w in ours]
            == [(str(w.message), w.category, w.filename, w.lineno) for w in theirs])
    assert len(ours) == 1 and ours[0].filename == torch.utils.data.dataloader.__file__


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pin_memory_pins_in_the_parent():
    loader = ThreadDataLoader(Squares(8), batch_size=4, num_workers=2, worker_processes=2, pin_memory=True,
                              multiprocessing_context=FORK)
    batches = list(loader)
    assert all(b[1].is_pinned() for b in batches)
    assert to_list(batches) == to_list(DataLoader(Squares(8), batch_size=4))
    assert loader.stats().snapshot()["pin_s"] > 0


# --- batch buffers reused across processes (_procs.arena) ---------------------------------

class _Frames(Dataset):
    """Sample i: an 8x6 RGB frame of value i % 251, and i."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        from threadloader import Frame

        return Frame(np.full((8, 6, 3), i % 251, np.uint8)), i


@pytest.mark.parametrize("normalize", [False, True])
def test_frame_batches_from_processes_reuse_their_buffers_and_never_overwrite_a_held_one(normalize):
    import functools

    from threadloader import frame_collate
    from threadloader.procs.mirror import mirror_count

    mirrors = mirror_count()
    collate = functools.partial(frame_collate, normalize=((0.5,), (0.25,))) if normalize else frame_collate
    expected = list(DataLoader(_Frames(), batch_size=4, collate_fn=collate))
    loader = ThreadDataLoader(_Frames(), batch_size=4, num_workers=4, worker_processes=2, collate_fn=collate,
                              persistent_workers=True, multiprocessing_context=FORK)
    held = None
    for _ in range(3):
        for k, (images, labels) in enumerate(loader):
            assert torch.equal(images, expected[k][0]) and images.stride() == expected[k][0].stride()
            assert torch.equal(labels, expected[k][1]) and not labels.is_shared()  # a copy in the arena too
            if held is None:  # the first batch, a view and a NumPy array of it, kept to the end
                held = (images, images[1:3], images.numpy()[0], expected[k][0].clone())
    images, view, arr, value = held
    assert torch.equal(images, value) and torch.equal(view, value[1:3]) and np.array_equal(arr, value.numpy()[0])
    # 48 batches, yet each child mapped only its in-flight working set (2 per
    # worker thread, the consumer's, the one being pinned: images and labels
    # each) and the held batch's images.
    blocks = [len(c.mirror._blocks) for c in loader._iterator._pool._children]
    assert all(n <= 2 * (2 * 2 + 2) + 1 for n in blocks), blocks
    del loader, held, images, view, arr
    gc.collect()
    assert mirror_count() == mirrors


def test_a_stopped_pool_leaves_no_mirror_and_its_batches_stay_readable():
    from threadloader import frame_collate
    from threadloader.procs.mirror import mirror_count

    mirrors = mirror_count()
    loader = ThreadDataLoader(_Frames(), batch_size=8, num_workers=2, worker_processes=2, collate_fn=frame_collate,
                              multiprocessing_context=FORK)
    batches = list(loader)  # not persistent: the pool stopped at the epoch's end
    assert mirror_count() == mirrors
    assert [b[0][:, 0, 0, 0].tolist() for b in batches] == [list(range(k, k + 8)) for k in range(0, 64, 8)]


FILE_SYSTEM_STRATEGY_CHILD = textwrap.dedent(
    """
    import gc, os, sys, time
    import numpy as np, torch
    from torch.utils.data import Dataset
    from threadloader import Frame, ThreadDataLoader, frame_collate

    class Frames(Dataset):
        def __len__(self):
            return 32
        def __getitem__(self, i):
            return Frame(np.full((16, 16, 3), i, np.uint8)), i

    def named():  # file_system segments are named torch_<creator pid>_...
        return {n for n in os.listdir("/dev/shm") if n.startswith("torch_")}

    if __name__ == "__main__":
        torch.multiprocessing.set_sharing_strategy("file_system")
        before = named()
        loader = ThreadDataLoader(Frames(), batch_size=4, num_workers=2, worker_processes=2, prefetch_factor=4,
                                  collate_fn=frame_collate, multiprocessing_context=sys.argv[1])
        for epoch in range(int(sys.argv[3])):
            if sys.argv[2] == "break":  # results the loop never reads are queued when the pool stops
                for batch in loader:
                    time.sleep(0.3)
                    break
                del batch
            else:
                assert [int(y.sum()) for _, y in loader] == [sum(range(k, k + 4)) for k in range(0, 32, 4)]
        gc.collect()
        deadline = time.monotonic() + 5
        while named() - before and time.monotonic() < deadline:
            time.sleep(0.05)
        print(sorted(named() - before))
    """
)


# Spawned children import torch anew: two epochs (four children) already
# show a segment left per ended child.
@pytest.mark.parametrize("context,epochs,count", [(FORK, "whole", 3), ("spawn", "whole", 2), (FORK, "break", 3)])
def test_file_system_sharing_strategy_leaves_no_segment_of_an_ended_child_behind(context, epochs, count, tmp_path):
    # Children end in os._exit: an arena block, or the counters they were
    # started with, still mapped there kept its segment in /dev/shm until the
    # loader's process exited (an arena's worth per epoch). Results queued,
    # never read, when an epoch is broken off are unpickled and dropped as the
    # pool stops: torch counts a reference per message in flight.
    script = tmp_path / "file_system.py"  # a file: spawned children import the dataset's class from it
    script.write_text(FILE_SYSTEM_STRATEGY_CHILD)
    out = subprocess.run([sys.executable, str(script), context, epochs, str(count)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


GC_IN_RECEIVER_CHILD = textwrap.dedent(
    """
    import gc, time
    import torch
    from torch.utils.data import Dataset
    from threadloader import ThreadDataLoader
    from threadloader.procs.mirror import mirror_count

    class Collecting(BaseException):  # ends its worker thread; unpickled by a receiver: a collection runs there
        def __reduce__(self):
            return gc.collect, ()

    class Data(Dataset):
        def __len__(self):
            return 200
        def __getitem__(self, i):
            if i == 8:  # the third batch: its worker thread dies once the iterator is garbage
                time.sleep(1.0)
                raise Collecting()
            return torch.full((4096,), float(i))

    def mapped():
        with open("/proc/self/maps") as maps:
            return sum("/dev/shm/" in line for line in maps)

    gc.disable()  # only the receiver's collection runs
    before = mapped()
    it = iter(ThreadDataLoader(Data(), batch_size=4, num_workers=2, worker_processes=2,
                               multiprocessing_context="fork"))
    it.cycle = it  # collected only by a collection: the one in a receiver thread
    next(it), next(it)
    del it
    time.sleep(3.0)
    deadline = time.monotonic() + 5
    while True:
        gc.collect()  # (a free-threaded build frees what other threads let go of at a collection)
        if (mirror_count(), mapped() - before) == (0, 0) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    print(mirror_count(), mapped() - before)
    """
)


def test_a_pool_stopped_from_its_receiver_thread_leaves_nothing_mapped():
    # An iterator in a reference cycle is stopped by whichever thread's
    # allocation runs the garbage collection: a receiver's skipped its mirror.
    out = subprocess.run([sys.executable, "-c", GC_IN_RECEIVER_CHILD], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["0", "0"]


FORK_HANGS_CHILD = textwrap.dedent(
    """
    import json, os, sys, time, warnings
    import psutil
    from threadloader import ThreadDataLoader
    from threadloader.procs import process_pool as procs_pool

    hangs, marks = int(sys.argv[1]), sys.argv[2]
    procs_pool.FORK_START_S = 1.0

    def hang_in_the_fork():
        # The first `hangs` forks never get past their after-fork clean-up, as
        # a child of CPython gh-112275. Each fork appends a byte to `marks`: the
        # offset after an O_APPEND write is that fork's own number.
        fd = os.open(marks, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, b"x")
        number = os.lseek(fd, 0, os.SEEK_CUR)
        os.close(fd)
        if number <= hangs:
            time.sleep(3600)

    os.register_at_fork(after_in_child=hang_in_the_fork)
    loader = ThreadDataLoader(list(range(16)), batch_size=4, num_workers=2, worker_processes=2,
                              multiprocessing_context="fork")
    out = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out["batches"] = [b.tolist() for b in loader]
        except RuntimeError as e:
            out["error"] = str(e)
    out["warnings"] = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    out["forks"] = os.path.getsize(marks)
    out["children"] = [c.pid for c in psutil.Process().children(recursive=True)]
    print(json.dumps(out))
    """
)


@pytest.mark.parametrize("hangs", [0, 1, 6])
def test_a_child_hung_in_its_fork_is_forked_again_and_at_last_reported(hangs, tmp_path):
    # CPython before 3.11.10 (gh-112275) can leave a forked child waiting for
    # ever before it runs any code: DataLoader would wait for ever too. A child
    # silent for FORK_START_S is killed and forked again (warned); after
    # FORK_ATTEMPTS forks it is an error naming the cure. Nothing is left.
    out = subprocess.run([sys.executable, "-c", FORK_HANGS_CHILD, str(hangs), str(tmp_path / "forks")], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["children"] == []
    if hangs == 6:  # both children's three forks hung
        assert "did not start: 3 forks of this process hung" in result["error"]
        assert "multiprocessing_context='forkserver'" in result["error"]
        assert result["forks"] == 6 and len(result["warnings"]) == 4
        return
    assert result["batches"] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert result["forks"] == 2 + hangs and len(result["warnings"]) == hangs
    assert all("gh-112275" in w and "forked again" in w for w in result["warnings"])
