"""loader.stats(): counters, and the warning when the dataset holds the GIL."""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
import warnings

import pytest
from helpers import Slow
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from threadloader import ThreadDataLoader, stats
from threadloader.procs import child as procs_child
from threadloader.procs import inline as procs_inline
from threadloader.stats import GIL_CHECK_INTERVAL_S

#: The GIL check's interval in these tests: half the library's, so that the few
#: intervals a test runs for take half the time. The verdict is the same.
CHECK_S = GIL_CHECK_INTERVAL_S / 2


@pytest.fixture(autouse=True)
def _short_gil_check_interval(monkeypatch):
    monkeypatch.setattr(stats.counters, "GIL_CHECK_INTERVAL_S", CHECK_S)  # read at each check


def _loop(work: int) -> int:
    x = 0
    for k in range(work):
        x += k
    return x


def _work_for(seconds: float) -> int:
    """Loop steps that take about ``seconds`` on this machine."""
    t0 = time.perf_counter()
    _loop(100_000)
    return max(1, int(100_000 * seconds / max(time.perf_counter() - t0, 1e-9)))


class PythonLoop(Dataset):
    """Pure-Python work: holds the GIL the whole time.

    A batch of 4 takes 4 GIL switch intervals (5 ms each) on any machine: a task
    shorter than one runs to its end once it has the GIL, and the other
    workers then wait for the GIL outside their fetch, which the check does
    not count as busy (on a fast machine a fixed loop was that short).
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.work = _work_for(sys.getswitchinterval())

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        _loop(self.work)
        return i


def run_for(loader, seconds: float) -> list:
    """Iterate until ``seconds`` passed (enough windows for the GIL check)."""
    out, deadline = [], time.monotonic() + seconds
    for batch in loader:
        out.append(batch)
        if time.monotonic() > deadline:
            break
    return out


def one_core():
    """This process's CPU time as threads taking turns on the GIL use it: one core's worth.

    Faked so that the verdict does not depend on how loaded the test machine is.
    """
    return time.perf_counter()


def children_use_one_core(monkeypatch) -> None:
    """Each worker process (forked: it inherits the fake) samples its CPU time as one core's worth.

    The child samples it at its start and then in its dispatcher's wait, in two modules.
    """
    monkeypatch.setattr(procs_child, "process_cpu_seconds", one_core)
    monkeypatch.setattr(procs_inline, "process_cpu_seconds", one_core)


def only_this_process_busy(cpus=None):
    """A machine where nothing but this process (one core) uses CPU: the other cores idle."""
    return one_core(), time.perf_counter()


def every_core_busy(cpus=None):
    """A machine whose every core is taken (by other processes too)."""
    return time.perf_counter() * (os.cpu_count() or 1), time.perf_counter()


needs_two_cores = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="the GIL check needs 2 cores to compare with")


def gil_warnings(monkeypatch, machine, seconds: float = 3 * CHECK_S + 0.5,
                 gil: bool | None = True, dataset=None, epochs: int = 1, **loader_kwargs) -> list:
    # The figures are simulated, and so is the GIL unless ``gil`` is None: on
    # a free-threaded Python with the GIL off, the check must stay silent.
    if gil is not None:
        monkeypatch.setattr(sys, "_is_gil_enabled", lambda: gil, raising=False)
    monkeypatch.setattr(stats.cpu, "system_cpu_seconds", machine)
    monkeypatch.setattr(stats.cpu, "process_cpu_seconds", one_core)
    dataset = PythonLoop(100_000) if dataset is None else dataset
    loader_kwargs.setdefault("worker_processes", 0)  # threads for good: the default would move them instead
    loader = ThreadDataLoader(dataset, batch_size=4, num_workers=2, **loader_kwargs)
    gil_warnings.loader = loader  # type: ignore[attr-defined]  # for a test that reads its stats
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(epochs):
            run_for(loader, seconds)
    return [w for w in caught if "holds the GIL" in str(w.message)]


@needs_two_cores
def test_warns_once_per_loader_not_once_per_epoch(monkeypatch):
    # Each epoch of a non-persistent loader is a new iterator: it warned again.
    gil = gil_warnings(monkeypatch, only_this_process_busy, seconds=2 * CHECK_S + 0.3, epochs=3)
    assert len(gil) == 1, gil


def test_the_clock_stops_when_the_iterator_is_dropped_after_break():
    # It kept running after the loop was left: elapsed_s grew, items_per_s fell.
    loader = ThreadDataLoader(Slow(40, 0.0), batch_size=4, num_workers=2)
    for k, _ in enumerate(loader):
        if k == 2:
            break
    del _
    gc.collect()  # the iterator is gone (it goes at once; a cycle would keep it to here)
    before = loader.stats().snapshot()
    time.sleep(0.3)
    after = loader.stats().snapshot()
    assert after["elapsed_s"] == before["elapsed_s"] and after["items_per_s"] == before["items_per_s"]


@needs_two_cores
def test_warns_once_when_workers_are_gil_bound(monkeypatch):
    gil = gil_warnings(monkeypatch, only_this_process_busy)
    assert len(gil) == 1, gil
    assert issubclass(gil[0].category, RuntimeWarning)
    message = str(gil[0].message)
    assert "Release the GIL" in message and "worker_processes=P" in message
    assert "cores stood idle" in message
    # Attributed to the user's line (the loop calling next()), not to threadloader or torch.
    assert gil[0].filename == __file__, gil[0].filename


@needs_two_cores
def test_the_default_moves_gil_bound_workers_into_processes_instead_of_warning(monkeypatch):
    # The figures that warn with threads for good; the children (forked) inherit the faked clock.
    children_use_one_core(monkeypatch)
    gil = gil_warnings(monkeypatch, only_this_process_busy, worker_processes=None, multiprocessing_context="fork")
    assert gil == []
    loader_stats = gil_warnings.loader.stats()
    assert loader_stats.mode.startswith("processes (adaptive: moved into 2 worker processes"), loader_stats.mode


@needs_two_cores
def test_warns_without_machine_wide_figures(monkeypatch):
    # Where the machine's CPU use cannot be read, the process's figures decide alone.
    gil = gil_warnings(monkeypatch, lambda cpus=None: None)
    assert len(gil) == 1 and "cores stood idle" not in str(gil[0].message)


@needs_two_cores
def test_no_gil_warning_when_the_machine_has_no_free_core(monkeypatch):
    # The same busy threads and one core of CPU, but other work holds the other cores:
    # the threads wait for a core, and the dataset is not to blame.
    assert gil_warnings(monkeypatch, every_core_busy) == []


@needs_two_cores
def test_no_gil_warning_when_the_gil_is_disabled(monkeypatch):
    assert gil_warnings(monkeypatch, only_this_process_busy, gil=False) == []


@needs_two_cores
@pytest.mark.skipif(stats.gil_enabled(), reason="needs a free-threaded Python running without the GIL")
def test_no_gil_warning_on_a_free_threaded_python(monkeypatch):
    # Not simulated: this interpreter really runs without the GIL.
    assert gil_warnings(monkeypatch, only_this_process_busy, gil=None) == []


@needs_two_cores
@pytest.mark.parametrize("worker_processes,expected", [(0, 1), (2, 0)])
def test_no_gil_warning_when_workers_run_in_processes(monkeypatch, worker_processes, expected):
    # The same figures (busy workers, one core of this process's CPU) blame the GIL for
    # worker threads of this process; workers in child processes use none of its CPU (or
    # GIL), and the warning's advice would be worker_processes itself. The dataset sleeps:
    # no child burns a core.
    kwargs = dict(worker_processes=worker_processes, multiprocessing_context="fork")
    gil = gil_warnings(monkeypatch, only_this_process_busy, 2 * CHECK_S + 0.5,
                       dataset=Slow(100_000, 0.01), **kwargs)
    assert len(gil) == expected, gil


@needs_two_cores
@pytest.mark.parametrize("num_workers,worker_processes", [(2, 1), (4, 2)])
def test_warns_when_the_threads_of_worker_processes_are_gil_bound(monkeypatch, num_workers, worker_processes):
    # Two or more threads per child take turns on that child's GIL: the check
    # was silent for every worker_processes loader. The children (forked)
    # inherit the faked CPU clock: each uses one core's worth.
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: True, raising=False)  # simulated on a free-threaded build too
    children_use_one_core(monkeypatch)
    monkeypatch.setattr(stats.cpu, "system_cpu_seconds", only_this_process_busy)
    loader = ThreadDataLoader(PythonLoop(100_000), batch_size=4, num_workers=num_workers,
                              worker_processes=worker_processes, multiprocessing_context="fork")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_for(loader, 3 * CHECK_S + 0.5)
    gil = [w for w in caught if "holds the GIL" in str(w.message)]
    assert len(gil) == 1, [str(w.message) for w in caught]
    message = str(gil[0].message)
    assert f"of the {worker_processes} worker processes" in message
    assert f"worker_processes={worker_processes} now, at most num_workers={num_workers}" in message
    assert gil[0].filename == __file__, gil[0].filename


class OneBusyWorker(Dataset):
    """Worker 0's batches take time, worker 1's none (batch 4, two workers): in order, worker 1 mostly idles."""

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> int:
        if (i // 4) % 2 == 0:
            time.sleep(0.005)
        return i


@needs_two_cores
def test_no_gil_warning_when_one_thread_of_a_worker_process_does_all_the_work(monkeypatch):
    # One busy thread on one core (the child's clock says one core) is no sign
    # of the GIL: the other thread idles. Its average share (0.5) warned.
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: True, raising=False)
    children_use_one_core(monkeypatch)
    monkeypatch.setattr(stats.cpu, "system_cpu_seconds", only_this_process_busy)
    loader = ThreadDataLoader(OneBusyWorker(), batch_size=4, num_workers=2, worker_processes=1,
                              multiprocessing_context="fork")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_for(loader, 3 * CHECK_S + 0.5)
    assert [w for w in caught if "holds the GIL" in str(w.message)] == []


@needs_two_cores
def test_no_gil_warning_when_the_threads_of_a_worker_process_wait_on_io(monkeypatch):
    # Busy threads (sleeping in their fetch) whose process uses almost no CPU:
    # not the GIL. The children's CPU clock is real here.
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: True, raising=False)
    monkeypatch.setattr(stats.cpu, "system_cpu_seconds", only_this_process_busy)
    loader = ThreadDataLoader(Slow(100_000, 0.01), batch_size=4, num_workers=2, worker_processes=1,
                              multiprocessing_context="fork")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_for(loader, 3 * CHECK_S + 0.5)
    assert [w for w in caught if "holds the GIL" in str(w.message)] == []


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2,
                    reason="needs CPU affinity and 2 cores")
def test_gil_check_counts_only_the_cores_this_process_may_use():
    # Pinned to one CPU (taskset, containers, SLURM), busy threads that
    # release the GIL use one core: that is the affinity, not the GIL. The
    # check uses the usable cores and their CPU time, not the machine's.
    import subprocess

    code = (
        "import os, sys; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from threadloader import stats; s = stats.LoaderStats(); "
        "first = stats.system_cpu_seconds(s._cpus); "
        "print(s._cores, s._cpus is not None, first is not None)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "True", "True"]


def test_system_cpu_seconds_grows_with_work():
    first = stats.system_cpu_seconds()
    if first is None:
        pytest.skip("no machine-wide CPU figures on this platform")
    deadline = time.perf_counter() + 0.2
    while time.perf_counter() < deadline:
        pass
    second = stats.system_cpu_seconds()
    assert second[1] > first[1] and second[0] > first[0]


def test_no_gil_warning_when_workers_wait_on_io():
    loader = ThreadDataLoader(Slow(10_000, 0.01), batch_size=2, num_workers=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_for(loader, 2 * CHECK_S + 0.5)
    assert not [w for w in caught if "holds the GIL" in str(w.message)]


def test_snapshot_fields_and_repr():
    loader = ThreadDataLoader(Slow(12, 0.002), batch_size=3, num_workers=2)
    assert loader.stats() is None
    list(loader)
    snap = loader.stats().snapshot()
    assert set(snap) == {"batches", "items", "elapsed_s", "wait_s", "fetch_s", "collate_s", "pin_s",
                         "items_fetched", "worker_utilization", "items_per_s", "mode"}
    assert snap["batches"] == 4 and snap["items"] == 12
    assert snap["wait_s"] > 0 and snap["collate_s"] >= 0
    assert "LoaderStats(batches=4, items=12" in repr(loader.stats())


def test_stats_restart_each_persistent_epoch():
    loader = ThreadDataLoader(Slow(8, 0.001), batch_size=2, num_workers=2, persistent_workers=True)
    list(loader)
    list(loader)
    snap = loader.stats().snapshot()
    assert snap["batches"] == 4 and snap["items_fetched"] == 8
    del loader


def test_tqdm_total_is_the_number_of_batches():
    tqdm = pytest.importorskip("tqdm").tqdm
    loader = ThreadDataLoader(Slow(10, 0), batch_size=3, num_workers=2)
    bar = tqdm(loader, disable=False, file=open(os.devnull, "w"))
    n = sum(1 for _ in bar)
    assert bar.total == len(loader) == n == 4


class Sharded(IterableDataset):
    """``n`` samples split between the workers: each replica's last batch is short."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, self.n, step))


@pytest.mark.parametrize("worker_processes", [0, 1])
def test_short_iterable_batches_count_the_samples_they_hold(worker_processes):
    loader = ThreadDataLoader(Sharded(20), batch_size=8, num_workers=2, worker_processes=worker_processes)
    batches = list(loader)
    snap = loader.stats().snapshot()
    assert sorted(len(b) for b in batches) == [2, 2, 8, 8]
    assert snap["batches"] == 4 and snap["items"] == 20 and snap["items_fetched"] == 20


def test_snapshot_clock_stops_when_the_epoch_ends():
    loader = ThreadDataLoader(Slow(6, 0.001), batch_size=2, num_workers=2)
    list(loader)
    first = loader.stats().snapshot()
    time.sleep(0.05)
    second = loader.stats().snapshot()
    assert second["elapsed_s"] == first["elapsed_s"] and second["items_per_s"] == first["items_per_s"]


@pytest.mark.parametrize("worker_processes", [0, 1])
def test_an_abandoned_epochs_tasks_do_not_count_in_the_next(worker_processes):
    loader = ThreadDataLoader(Slow(40, 0.002), batch_size=2, num_workers=2, persistent_workers=True,
                              prefetch_factor=4, worker_processes=worker_processes)
    for _ in loader:
        break  # 15 tasks still queued or running: they run to the end, results dropped
    assert len(list(loader)) == 20
    snap = loader.stats().snapshot()
    assert snap["batches"] == 20 and snap["items"] == 40 and snap["items_fetched"] == 40
    del loader


def test_iterable_fetch_time_is_never_negative_in_a_snapshot(monkeypatch):
    # The collate time is taken out of the fetch time in one update: a worker
    # paused right after its fetcher returned (descheduled) must not show a
    # negative fetch time to a snapshot taken meanwhile.
    import threadloader.engine.worker_loop as worker_loop

    class PausesAfterFetch:
        def __init__(self, fetcher):
            self.fetcher = fetcher

        def fetch(self, index):
            out = self.fetcher.fetch(index)
            time.sleep(0.3)
            return out

    create = worker_loop.create_fetcher
    monkeypatch.setattr(worker_loop, "create_fetcher", lambda *a, **k: PausesAfterFetch(create(*a, **k)))

    def slow_collate(batch):
        time.sleep(0.1)
        return batch

    loader = ThreadDataLoader(Sharded(4), batch_size=2, num_workers=1, collate_fn=slow_collate)
    it = iter(loader)
    time.sleep(0.25)  # inside the first task's pause
    snap = loader.stats().snapshot()
    assert len(list(it)) == 2
    assert snap["fetch_s"] >= 0 and snap["worker_utilization"] >= 0


def test_a_worker_starting_an_epoch_never_shows_the_old_count_under_it():
    # Read without a lock while the worker writes: every state a reader can
    # see between the writes must be a true one.
    seen = []

    class Watched(stats.WorkerCounters):
        def __setattr__(self, name, value):
            super().__setattr__(name, value)
            if name in ("epoch", "epoch_items"):
                seen.append((getattr(self, "epoch", None), getattr(self, "epoch_items", None)))

    counters = Watched()
    counters.fetched(0, 32)
    seen.clear()
    counters.fetched(1, 4)
    assert (1, 32) not in seen and seen[-1] == (1, 4)


class _NewEpochMidRead:
    """A worker's counters whose first read, once armed, lets another thread start the next epoch.

    That is the consumer calling ``new_epoch`` while a monitoring thread is
    inside ``snapshot()`` (with the GIL off, or between two bytecodes with it).
    """

    collate_s = pin_s = fetch_since = 0.0
    epoch = epoch_items = tasks = 0
    fetch_until = stats.WorkerCounters.fetch_until

    def __init__(self) -> None:
        self.stats: stats.LoaderStats | None = None
        self.other: threading.Thread | None = None

    @property
    def fetch_s(self) -> float:
        if self.stats is not None:
            self.other = threading.Thread(target=self.stats.new_epoch, args=(1,))
            self.stats = None
            self.other.start()
            self.other.join(0.2)  # it runs now, or waits until the snapshot is done
        return 5.0


def test_a_snapshot_never_mixes_two_epochs():
    # It read the epoch's start, end, baseline and counts at different times:
    # a new epoch starting mid-read gave the old epoch's clock with the new
    # epoch's counts (or negative times, or a TypeError on the end time).
    counter = _NewEpochMidRead()
    loader_stats = stats.LoaderStats()
    loader_stats.bind([counter], 1)
    loader_stats.new_epoch(0)
    loader_stats.batches, loader_stats.items = 3, 12
    loader_stats.ended()
    started, ended = loader_stats.started, loader_stats._ended
    counter.stats = loader_stats
    snap = loader_stats.snapshot()
    counter.other.join()
    assert (snap["batches"], snap["items"], snap["elapsed_s"]) == (3, 12, ended - started)
    assert snap["fetch_s"] == 0.0
    assert loader_stats.snapshot()["batches"] == 0  # the new epoch did start



def _held_back_run(monkeypatch, gil_wait_s: float) -> ThreadDataLoader:
    # Sixteen usable cores, of which the process uses two: threads held back, whether by
    # the GIL or by I/O; the GIL probe tells the two apart (faked here, as the machine).
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: True, raising=False)
    monkeypatch.setattr(stats.cpu, "usable_cpus", lambda: list(range(16)))
    monkeypatch.setattr(stats.cpu, "process_cpu_seconds", lambda: 2 * time.perf_counter())
    monkeypatch.setattr(stats.cpu, "system_cpu_seconds", lambda cpus=None: (2 * time.perf_counter(), time.perf_counter()))
    children_use_one_core(monkeypatch)
    monkeypatch.setattr(stats.gil, "gil_wait", lambda probes=3: gil_wait_s)
    loader = ThreadDataLoader(PythonLoop(100_000), batch_size=4, num_workers=4, multiprocessing_context="fork")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # neither case warns: the wider test only moves
        run_for(loader, 4 * stats.gil.ADAPT_CHECK_INTERVAL_S + 0.5)
    return loader


def test_the_default_moves_threads_the_gil_holds_back_on_many_cores(monkeypatch):
    loader = _held_back_run(monkeypatch, gil_wait_s=0.005)
    assert loader.stats().mode.startswith("processes (adaptive: moved into 4 worker processes"), loader.stats().mode


def test_threads_held_back_by_io_stay_threads(monkeypatch):
    loader = _held_back_run(monkeypatch, gil_wait_s=0.00001)
    assert loader.stats().mode.startswith("threads (adaptive: the workers move"), loader.stats().mode


def test_fetch_time_counts_the_fetch_in_progress():
    counters = stats.WorkerCounters()
    counters.fetch_s = 1.0
    assert counters.fetch_until(12.5) == 1.0  # no fetch running
    counters.fetch_since = 10.0
    assert counters.fetch_until(12.5) == 3.5
    assert counters.fetch_until(9.0) == 1.0  # a stamp after the reader's clock: not counted


def test_a_gil_sample_counts_the_wait_in_progress():
    loader_stats = stats.LoaderStats()
    loader_stats.bind([stats.WorkerCounters()], 1)
    loader_stats.waited(0.5)
    since = time.perf_counter() - 2.0
    loader_stats.waiting(since)
    assert loader_stats._gil_sample().wait >= 2.5
    loader_stats.waited(2.0)
    assert loader_stats._gil_sample().wait == 2.5  # the wait ended: counted once
