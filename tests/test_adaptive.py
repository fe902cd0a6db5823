"""The adaptive mode (``worker_processes=None``, the default): worker threads that move into processes.

A move happens between two batches the consumer reads. Here it is asked for
at exact points (``pool.move()`` on the iterator's pool, or the
``THREADLOADER_MOVE_AFTER`` variable), or comes from the GIL check with its
measurement replaced, so that each test really moves whatever the machine's
load. Everything a loader yields across a move must be DataLoader's.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import random
import sys
import threading
import warnings

import numpy as np
import pytest
import torch
from helpers import Sharded, Squares, to_list
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset, get_worker_info

from threadloader import ThreadDataLoader
from threadloader.adaptive import policy
from threadloader.adaptive import pool as adaptive_pool
from threadloader.engine.protocol import Mode
from threadloader.stats import gil

FORK = "fork"


class Augmented(Dataset):
    """A GIL-bound map-style dataset with random "transforms" through every global RNG API."""

    def __init__(self, n: int = 48, fail: int | None = None) -> None:
        self.n, self.fail = n, fail

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == self.fail:
            raise ValueError(f"bad sample {i}")
        acc = 0
        for k in range(200):  # Python that holds the GIL
            acc += k * i
        return i, acc, torch.rand(2), random.random(), float(np.random.rand())


def _batches(loader, epochs: int = 1, move_at: int | None = None) -> list:
    """Every batch of ``epochs`` epochs, as lists; the workers asked to move after ``move_at`` batches of the first."""
    out = []
    for epoch in range(epochs):
        it = iter(loader)
        for k, batch in enumerate(it):
            out.append(to_list(batch))
            if epoch == 0 and k + 1 == move_at:
                assert it._pool.move()
    return out


def _oracle(dataset, epochs: int = 1, **kwargs) -> list:
    torch.manual_seed(0)
    return _batches(DataLoader(dataset, multiprocessing_context=FORK, **kwargs), epochs)


def _ours(dataset, epochs: int = 1, move_at: int | None = None, **kwargs):
    torch.manual_seed(0)
    loader = ThreadDataLoader(dataset, multiprocessing_context=FORK, **kwargs)
    return loader, _batches(loader, epochs, move_at)


@pytest.fixture(autouse=True)
def eligible_without_a_gil(monkeypatch):
    # On a free-threaded Python with the GIL off the default stays on threads; the moves tested here are asked for.
    monkeypatch.setattr(policy, "gil_enabled", lambda: True)


@pytest.fixture(autouse=True)
def no_orphans():
    before = set(multiprocessing.active_children())
    yield
    gc.collect()  # an iterator held by an error's traceback
    for child in set(multiprocessing.active_children()) - before:
        child.join(timeout=5)
    assert set(multiprocessing.active_children()) <= before


@pytest.mark.parametrize("move_at", [1, 3, 7])
@pytest.mark.parametrize("persistent", [False, True])
def test_a_move_keeps_dataloaders_batches_and_random_streams(move_at, persistent):
    kwargs = dict(batch_size=4, shuffle=True, num_workers=2, persistent_workers=persistent)
    expected = _oracle(Augmented(), epochs=3, **kwargs)
    loader, got = _ours(Augmented(), epochs=3, move_at=move_at, **kwargs)
    assert got == expected
    report = loader.stats().mode
    assert report.startswith("processes (adaptive: moved into 2 worker processes"), report


def test_unordered_batches_across_a_move_are_dataloaders():
    # Which worker serves a task depends on timing here (DataLoader's too), and so do its random draws.
    kwargs = dict(batch_size=3, shuffle=True, num_workers=3, in_order=False, persistent_workers=True)
    expected = _oracle(Squares(40), epochs=2, **kwargs)
    _, got = _ours(Squares(40), epochs=2, move_at=2, **kwargs)
    assert sorted(got) == sorted(expected) and len(got) == len(expected)


def test_worker_init_fn_runs_once_per_worker_across_a_move(tmp_path):
    log = tmp_path / "init.log"

    def init(worker_id):
        with open(log, "a") as f:  # one short append per call: whole lines from any process
            f.write(f"{worker_id} {os.getpid()}\n")
        get_worker_info().dataset.offset = 1000 * (worker_id + 1)  # the copy's state travels with it

    class Offset(Augmented):
        offset = 0

        def __getitem__(self, i):
            return (self.offset, *super().__getitem__(i))

    kwargs = dict(batch_size=2, num_workers=2, persistent_workers=True, worker_init_fn=init)
    loader, got = _ours(Offset(16), epochs=2, move_at=1, **kwargs)
    lines = log.read_text().split()
    assert sorted(lines[0::2]) == ["0", "1"] and set(lines[1::2]) == {str(os.getpid())}  # in the threads, once
    assert {batch[0][0] for batch in got} == {1000, 2000}
    assert loader.stats().mode.startswith("processes")


def test_an_error_after_a_move_is_dataloaders():
    kwargs = dict(batch_size=2, num_workers=2)
    loader = ThreadDataLoader(Augmented(24, fail=15), multiprocessing_context=FORK, **kwargs)
    it = iter(loader)
    next(it)
    assert it._pool.move()
    seen = 1
    with pytest.raises(ValueError, match="bad sample 15") as info:
        for _ in it:
            seen += 1
    assert seen == 7  # batches 0..6 came; batch 7 holds sample 15
    assert "Caught ValueError in DataLoader worker" in str(info.value)
    assert loader.stats().mode.startswith("processes")
    del it


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_checkpoint_taken_next_to_a_move_resumes_dataloaders_epoch(when):
    kwargs = dict(batch_size=4, shuffle=True, num_workers=2)
    expected = _oracle(Squares(40), epochs=2, **kwargs)
    torch.manual_seed(0)
    loader = ThreadDataLoader(Squares(40), multiprocessing_context=FORK, **kwargs)
    it = iter(loader)
    got = [to_list(next(it)) for _ in range(3)]
    if when == "before":
        state = loader.state_dict()
        assert it._pool.move()
    else:
        assert it._pool.move()
        state = loader.state_dict()
    got.append(to_list(next(it)))  # the moved workers' first batch
    del it
    resumed = ThreadDataLoader(Squares(40), multiprocessing_context=FORK, **kwargs)
    resumed.load_state_dict(state)
    rest = _batches(resumed, epochs=2)
    assert got[:3] + rest == expected


def test_the_gil_check_moves_workers_whose_tasks_are_big(monkeypatch):
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: True, raising=False)  # simulated on a free-threaded build too
    # The check's measurement replaced: every window of worker threads looks GIL-bound.
    monkeypatch.setattr(gil, "verdict", lambda *a, workers_here, **k: "GIL-bound" if workers_here else None)
    monkeypatch.setattr(gil, "ADAPT_CHECK_INTERVAL_S", 0.0)
    monkeypatch.setattr(policy, "MIN_TASK_CPU_S", 0.0)
    kwargs = dict(batch_size=4, shuffle=True, num_workers=2)
    expected = _oracle(Augmented(), **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a move, not a warning
        loader, got = _ours(Augmented(), **kwargs)
    assert got == expected
    assert loader.stats().mode.startswith("processes (adaptive: moved into 2 worker processes")
    assert "took turns on the GIL" in loader.stats().mode
    assert loader.stats().snapshot()["mode"] == loader.stats().mode


class Gated(Dataset):
    """Samples that wait for a gate: the first tasks outlast any window of the GIL check."""

    gate = threading.Event()

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        if not self.gate.wait(timeout=30):
            raise TimeoutError("the workers did not begin to move while their first tasks ran")
        return i


def test_the_gil_check_looks_while_the_first_tasks_run(monkeypatch):
    # The check ran only as results arrived: tasks of seconds put the move seconds into the epoch.
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: True, raising=False)
    monkeypatch.setattr(gil, "verdict", lambda *a, workers_here, **k: "GIL-bound" if workers_here else None)
    monkeypatch.setattr(policy, "MIN_TASK_CPU_S", 0.0)
    move = adaptive_pool.AdaptivePool.move

    def move_and_open(self, target=Mode.PROCESSES):
        began = move(self, target)
        Gated.gate.set()
        return began

    monkeypatch.setattr(adaptive_pool.AdaptivePool, "move", move_and_open)
    Gated.gate.set()
    expected = _oracle(Gated(), batch_size=2, num_workers=2)
    Gated.gate.clear()
    loader, got = _ours(Gated(), batch_size=2, num_workers=2)
    assert got == expected
    assert loader.stats().mode.startswith("processes (adaptive: moved into 2 worker processes")
    assert "inf ms" not in loader.stats().mode  # the tasks still running count in the CPU per task


def test_workers_whose_tasks_are_too_small_stay_threads_and_warn(monkeypatch):
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: True, raising=False)
    monkeypatch.setattr(gil, "verdict", lambda *a, **k: "GIL-bound")
    monkeypatch.setattr(gil, "ADAPT_CHECK_INTERVAL_S", 0.0)
    monkeypatch.setattr(policy, "MIN_TASK_CPU_S", float("inf"))
    loader = ThreadDataLoader(Augmented(), batch_size=4, num_workers=2)
    with pytest.warns(RuntimeWarning, match="GIL-bound"):
        to_list(loader)
    assert loader.stats().mode.startswith("threads (adaptive: the workers look GIL-bound, but a task costs")


def test_a_later_epoch_starts_where_the_first_moved():
    kwargs = dict(batch_size=4, shuffle=True, num_workers=2)
    expected = _oracle(Augmented(40), epochs=2, **kwargs)
    loader, first = _ours(Augmented(40), move_at=1, **kwargs)
    it = iter(loader)
    assert not it._pool.in_process  # worker processes from the start
    assert first + to_list(it) == expected
    assert loader.stats().mode.startswith("processes (adaptive: moved")


def test_workers_stay_threads_when_the_processes_do_not_start(monkeypatch):
    def refuse(self, cfg):
        raise OSError("no processes here")

    real = adaptive_pool.AdaptivePool.__init__

    def init(self, cfg, report, start_processes, inline_blocked=None):
        real(self, cfg, report, lambda cfg: refuse(self, cfg), inline_blocked)

    monkeypatch.setattr(adaptive_pool.AdaptivePool, "__init__", init)
    kwargs = dict(batch_size=4, shuffle=True, num_workers=2)
    expected = _oracle(Augmented(), epochs=2, **kwargs)
    loader, got = _ours(Augmented(), epochs=2, move_at=2, **kwargs)
    assert got == expected
    assert loader.stats().mode == (
        "threads (adaptive: stays on threads, starting the worker processes failed: OSError('no processes here'))")


def test_move_after_variable_moves_the_workers(monkeypatch):
    monkeypatch.setenv(policy.MOVE_AFTER_ENV, "2")
    kwargs = dict(batch_size=4, shuffle=True, num_workers=2)
    expected = _oracle(Augmented(), **kwargs)
    loader, got = _ours(Augmented(), **kwargs)
    assert got == expected
    assert loader.stats().mode.endswith(f"asked for ({policy.MOVE_AFTER_ENV}))")


def test_move_after_variable_must_be_a_count(monkeypatch):
    monkeypatch.setenv(policy.MOVE_AFTER_ENV, "soon")
    with pytest.raises(ValueError, match="THREADLOADER_MOVE_AFTER must be a non-negative integer, got 'soon'"):
        iter(ThreadDataLoader(Squares(4), num_workers=2))


@pytest.mark.parametrize("kwargs, why", [
    (dict(worker_processes=0), "threads (worker_processes=0)"),
    (dict(worker_processes=2), "processes (worker_processes=2)"),
    (dict(), "threads (adaptive: the workers move into processes if they hold the GIL, "
             "or into the consumer's thread if their tasks cost less than the hand-offs)"),
    (dict(timeout=5), "threads (adaptive: the workers move into processes if they hold the GIL)"),
])
def test_stats_say_which_mode_runs_and_why(kwargs, why):
    loader = ThreadDataLoader(Squares(8), batch_size=2, num_workers=2, multiprocessing_context=FORK, **kwargs)
    to_list(loader)
    assert loader.stats().mode == why
    assert why in repr(loader.stats())


def test_an_iterable_dataset_stays_on_threads():
    loader = ThreadDataLoader(Sharded(0, 8), batch_size=2, num_workers=2)
    assert sorted(sum(to_list(loader), [])) == list(range(8))
    assert loader.stats().mode == (
        "threads (adaptive: stays on threads, an IterableDataset: its workers' iterators cannot move into processes)")
    assert Mode.THREADS.value == "threads"


@settings(max_examples=6, deadline=None)
@given(n=st.integers(1, 40), batch_size=st.integers(1, 5), workers=st.integers(2, 3), move_at=st.integers(1, 6),
       persistent=st.booleans(), shuffle=st.booleans())
def test_any_move_point_keeps_dataloaders_batches(n, batch_size, workers, move_at, persistent, shuffle):
    kwargs = dict(batch_size=batch_size, num_workers=workers, persistent_workers=persistent, shuffle=shuffle)
    expected = _oracle(Augmented(n), epochs=2, **kwargs)
    batches = -(-n // batch_size)
    _, got = _ours(Augmented(n), epochs=2, move_at=min(move_at, batches), **kwargs)
    assert got == expected


def test_workers_move_into_spawned_processes_with_their_state():
    # Nothing is inherited: each handoff (copy, generator states) is pickled to its own child.
    kwargs = dict(batch_size=4, shuffle=True, num_workers=2)
    expected = _oracle(Augmented(40), **kwargs)
    torch.manual_seed(0)
    loader = ThreadDataLoader(Augmented(40), multiprocessing_context="spawn", **kwargs)
    got = _batches(loader, move_at=2)
    assert got == expected
    assert loader.stats().mode.startswith("processes (adaptive: moved")


def test_workers_that_started_threads_of_their_own_stay_threads():
    # A forked process would not have the executor's threads: the dataset would wait on them for ever.
    from concurrent.futures import ThreadPoolExecutor

    def init(worker_id):
        get_worker_info().dataset.executor = ThreadPoolExecutor(1, thread_name_prefix=f"prefetch-{worker_id}")

    class Prefetching(Augmented):
        def __getitem__(self, i):
            return self.executor.submit(super().__getitem__, i).result()

    kwargs = dict(batch_size=4, shuffle=True, num_workers=2, worker_init_fn=init)
    expected = _oracle(Augmented(40), **kwargs)  # DataLoader's processes start their own executors
    torch.manual_seed(0)
    loader = ThreadDataLoader(Prefetching(40), multiprocessing_context=FORK, **kwargs)
    it = iter(loader)
    got = [to_list(next(it)) for _ in range(2)]
    assert not it._pool.move()
    got += to_list(it)
    assert loader.stats().mode == ("threads (adaptive: stays on threads, threads the workers started "
                                   "(prefetch-0_0, prefetch-1_0) would be missing in a worker process)")
    assert len(got) == len(expected)


def test_threads_that_a_worker_thread_s_thread_starts_also_keep_the_workers_threads():
    def init(worker_id):
        def spawn_grandchild():
            grandchild = threading.Thread(target=stop.wait, name=f"grandchild-{worker_id}", daemon=True)
            grandchildren.append(grandchild)
            grandchild.start()

        child = threading.Thread(target=spawn_grandchild, name=f"child-{worker_id}")
        child.start()
        child.join()  # the thread between has ended: the grandchild is still traced to the worker

    stop = threading.Event()
    grandchildren: list[threading.Thread] = []
    loader = ThreadDataLoader(Augmented(16), batch_size=4, num_workers=2, worker_init_fn=init,
                              multiprocessing_context=FORK)
    try:
        it = iter(loader)
        got = [next(it), next(it)]  # one batch from each worker: both have run worker_init_fn
        assert not it._pool.move()
        assert loader.stats().mode == ("threads (adaptive: stays on threads, threads the workers started "
                                       "(grandchild-0, grandchild-1) would be missing in a worker process)")
        assert len(got + list(it)) == 4
    finally:
        stop.set()
        for thread in grandchildren:
            thread.join(5)


def test_threads_the_training_loop_starts_mid_epoch_do_not_keep_the_workers_threads():
    # A logger or a checkpoint writer starts threads the workers never use.
    kwargs = dict(batch_size=4, shuffle=True, num_workers=2)
    expected = _oracle(Augmented(40), **kwargs)
    stop = threading.Event()
    torch.manual_seed(0)
    loader = ThreadDataLoader(Augmented(40), multiprocessing_context=FORK, **kwargs)
    try:
        it = iter(loader)
        got = [to_list(next(it))]
        threading.Thread(target=stop.wait, name="logger", daemon=True).start()
        assert it._pool.move()
        got += [to_list(batch) for batch in it]
    finally:
        stop.set()
    assert got == expected
    assert loader.stats().mode.startswith("processes (adaptive: moved")


def test_without_a_gil_the_default_stays_on_threads(monkeypatch):
    monkeypatch.setattr(policy, "gil_enabled", lambda: False)
    loader = ThreadDataLoader(Squares(8), batch_size=2, num_workers=2)
    to_list(loader)
    assert loader.stats().mode == "threads (adaptive: stays on threads, this Python runs without a GIL: threads run in parallel)"


class InfoRng(Dataset):
    """Draws from ``get_worker_info().rng``'s generators (torch's thread-worker API), which DataLoader's processes lack."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int):
        rng = get_worker_info().rng
        return (i, rng.numpy_generator.random(), rng.random_generator.random(),
                torch.rand(1, generator=rng.torch_generator).item())


def test_a_moved_worker_goes_on_with_its_worker_info_generators():
    kwargs = dict(batch_size=4, shuffle=True, num_workers=2)
    torch.manual_seed(0)
    expected = to_list(ThreadDataLoader(InfoRng(), worker_processes=0, **kwargs))
    _, got = _ours(InfoRng(), move_at=2, **kwargs)
    assert got == expected


class InnerLoader(Dataset):
    """Each sample runs a ThreadDataLoader of its own and returns where its workers ran."""

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> str:
        loader = ThreadDataLoader(Augmented(40), batch_size=4, num_workers=2)
        to_list(loader)
        return loader.stats().mode


def test_a_loader_in_a_daemon_process_stays_on_threads(monkeypatch):
    # DataLoader's worker processes are daemons, which may not start processes of their own.
    monkeypatch.setenv(policy.MOVE_AFTER_ENV, "1")
    (mode,) = list(DataLoader(InnerLoader(), batch_size=None, num_workers=1, multiprocessing_context=FORK))
    assert mode == ("threads (adaptive: stays on threads, this process is a daemon (a worker process itself), "
                    "which cannot start processes)")


class Counting(Dataset):
    """A dataset with its own state (``state_dict``): how many samples its copy fetched."""

    def __init__(self) -> None:
        self.count = 0

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int):
        self.count += 1
        return i, self.count, torch.rand(1).item()

    def state_dict(self) -> dict:
        return {"count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.count = state["count"]


@pytest.mark.parametrize("move_after", ["0", "3"])
def test_a_dataset_with_its_own_state_resumes_across_a_move_as_with_threads(monkeypatch, move_after):
    def run():
        torch.manual_seed(0)
        kwargs = dict(batch_size=2, shuffle=True, num_workers=2, persistent_workers=True, multiprocessing_context=FORK)
        loader = ThreadDataLoader(Counting(), **kwargs)
        it = iter(loader)
        head = [to_list(next(it)) for _ in range(6)]
        state = loader.state_dict()
        del it
        resumed = ThreadDataLoader(Counting(), **kwargs)
        resumed.load_state_dict(state)
        # The resumed loader's mode: the first may stop reading before its workers parked.
        return head + to_list(resumed) + to_list(resumed), resumed.stats().mode

    expected, mode = run()  # no move: the variable is not set
    assert mode.startswith("threads")
    monkeypatch.setenv(policy.MOVE_AFTER_ENV, move_after)
    got, mode = run()
    assert got == expected
    assert mode.startswith("processes (adaptive: moved")



#: Set when sample 0 of :class:`Straggler` begins, and by the test when it may end.
_STARTED, _RELEASE = threading.Event(), threading.Event()


class Straggler(Dataset):
    """Sample 0 waits until the test releases it (at most 10 s); the others come at once."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int):
        if i == 0:
            _STARTED.set()
            _RELEASE.wait(timeout=10)
        return get_worker_info().id, i


def test_a_slow_task_holds_up_no_other_worker_while_the_workers_move():
    # With in_order=False, DataLoader's other worker serves on while one task takes long (torch's
    # test_out_of_order_index_ds). Here the move begins while worker 0 is on sample 0: worker 1
    # parks, serves on as a thread meanwhile, and parks again once worker 0 has parked.
    _STARTED.clear()
    _RELEASE.clear()
    loader = ThreadDataLoader(Straggler(), batch_size=None, num_workers=2, in_order=False,
                              multiprocessing_context=FORK)
    it = iter(loader)
    got = [tuple(next(it))]
    assert _STARTED.wait(timeout=10)
    assert it._pool.move()
    for sample in it:
        got.append(tuple(sample))
        if len(got) == 8:
            _RELEASE.set()
    assert got == [(1, 1), (1, 3), (1, 4), (1, 5), (1, 6), (1, 7), (1, 8), (1, 9), (0, 0), (0, 2)]
    assert loader.stats().mode.startswith("processes (adaptive: moved into 2 worker processes")
