"""The per-task path of ``worker_processes``: a lone worker in its child's main thread, the consumer reading the
children's pipes itself, plain tuples on the wire, one poll per wait.

Every test checks, through test_procs' fixture, that no child process, worker
thread, file descriptor or shared memory is left behind.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from multiprocessing import connection as mp_connection
from multiprocessing.reduction import ForkingPickler

import pytest
import test_procs
import torch
from helpers import Slow, Squares, to_list, wait_until
from test_procs import FORK
from torch.utils.data import DataLoader, Dataset, get_worker_info

from threadloader import ThreadDataLoader
from threadloader.engine.protocol import Job, Kind, Message
from threadloader.procs import process_pool, readers, wire
from threadloader.worker import rng as _rng

pytestmark = pytest.mark.usefixtures("no_leaks")


class _WhereItRuns(Dataset):
    """Sample i: where worker thread that fetched it runs, and what its torch calls go through."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        return {
            "main_thread": threading.current_thread() is threading.main_thread(),
            "thread": threading.current_thread().name,
            "modes": torch._C._len_torch_function_stack(),
            # The generator torch.rand draws from here: the worker thread's own, or the process's.
            "routed": _rng.calling_generators()[1] is not torch.default_generator,
            "worker": get_worker_info().id,
            "pid": os.getpid(),
        }


def test_a_lone_worker_runs_in_its_childs_main_thread_and_its_draws_are_not_routed():
    # One worker per process (DataLoader's split): no thread hand-off between
    # the child's job queue and its worker, and its process's generators are
    # the worker's own, so nothing routes its draws.
    got = list(ThreadDataLoader(_WhereItRuns(), batch_size=None, num_workers=2, worker_processes=2,
                                multiprocessing_context=FORK))
    assert all(s["main_thread"] and s["modes"] == 0 and not s["routed"] for s in got)
    assert [s["thread"] for s in got] == [f"threadloader-worker-{s['worker']}" for s in got]
    assert len({s["pid"] for s in got}) == 2 and os.getpid() not in {s["pid"] for s in got}


def test_workers_sharing_a_child_run_in_threads_whose_draws_are_routed():
    got = list(ThreadDataLoader(_WhereItRuns(), batch_size=None, num_workers=4, worker_processes=2,
                                multiprocessing_context=FORK))
    assert not any(s["main_thread"] for s in got)
    assert all(s["routed"] and s["modes"] == 0 for s in got)  # each thread's own generators (worker/rng.py)
    assert len({s["pid"] for s in got}) == 2


class _Draws(Dataset):
    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int):
        return torch.rand(2), torch.randint(0, 1000, (1,))


@pytest.mark.parametrize("persistent", [False, True])
def test_a_lone_workers_draws_are_dataloaders(persistent):
    def epochs(cls, **kw):
        loader = cls(_Draws(), batch_size=3, num_workers=2, persistent_workers=persistent,
                     generator=torch.Generator().manual_seed(5), multiprocessing_context=FORK, **kw)
        return [to_list(list(loader)) for _ in range(2)]

    assert epochs(ThreadDataLoader, worker_processes=2) == epochs(DataLoader)


def _receivers() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("threadloader-receiver")]


def test_without_pinning_the_consumer_reads_the_children_itself():
    it = iter(ThreadDataLoader(Squares(40), batch_size=4, num_workers=2, worker_processes=2,
                               multiprocessing_context=FORK))
    first = next(it)
    assert _receivers() == [] and all(c.receiver is None for c in it._pool._children)
    assert to_list([first, *it]) == to_list(DataLoader(Squares(40), batch_size=4))


def test_receivers_still_serve_where_the_pool_does_not_read_directly(monkeypatch):
    monkeypatch.setattr(process_pool, "DIRECT_READ", False)
    it = iter(ThreadDataLoader(Squares(40), batch_size=4, num_workers=4, worker_processes=2,
                               multiprocessing_context=FORK))
    first = next(it)
    assert sorted(_receivers()) == ["threadloader-receiver-0", "threadloader-receiver-1"]
    assert to_list([first, *it]) == to_list(DataLoader(Squares(40), batch_size=4))


# The failures a receiver reported, now reported by the consumer's own reads, and
# still by receivers (where the pool pins): the same words, no hang, nothing left.
_BEHAVIOURS = [
    test_procs.test_killed_worker_process_raises_once_then_the_others_go_on,
    test_procs.test_a_worker_process_exiting_is_raised_where_dataloader_raises_it,
    test_procs.test_result_that_cannot_be_received_raises_its_error_and_the_iterator_goes_on,
    test_procs.test_result_that_cannot_be_sent_raises_instead_of_hanging,
    test_procs.test_persistent_loader_raises_the_crash_again_next_epoch,
    test_procs.test_workers_keep_answering_after_the_iterator_stops,
]


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "receivers"])
@pytest.mark.parametrize("behaviour", _BEHAVIOURS, ids=lambda f: f.__name__[5:45])
def test_failures_are_reported_alike_by_both_readers(behaviour, direct, monkeypatch):
    monkeypatch.setattr(process_pool, "DIRECT_READ", direct)
    behaviour()


def test_a_timeout_while_the_consumer_reads_the_children_is_dataloaders():
    loader = ThreadDataLoader(Slow(4, 3.0), num_workers=2, worker_processes=2, timeout=0.3,
                              multiprocessing_context=FORK)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"^DataLoader timed out after 0.3 seconds$"):
        next(iter(loader))
    assert time.monotonic() - started < 2.5


class _SlowFirst(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        if i < 2:
            time.sleep(30)
        return i


@pytest.mark.parametrize("num_workers", [2, 4], ids=["lone-worker", "worker-threads"])
def test_a_child_told_to_stop_by_sigterm_mid_task_exits_as_a_crash_not_a_worker_error(num_workers):
    # SIGTERM unwinds the child's main thread: running its lone worker's
    # task there, that is the child stopping (exit code 0), not its worker failing.
    it = iter(ThreadDataLoader(_SlowFirst(), batch_size=None, num_workers=num_workers, worker_processes=2,
                               multiprocessing_context=FORK, timeout=20))
    pool = it._pool
    pids = pool.pids
    assert wait_until(lambda: pool.counters[0].busy, timeout=20)  # in its first task's sleep
    os.kill(pids[0], signal.SIGTERM)
    with pytest.raises(RuntimeError, match=rf"^DataLoader worker \(pid\(s\) {pids[0]}\) exited unexpectedly$") as info:
        next(it)
    assert info.value.__cause__ is None  # exit code 0: torch's check has nothing to say
    assert it._workers[0].exitcode == 0
    del it


class _DiesOfABaseException(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        if i == 2:
            raise KeyboardInterrupt("worker 0 gives up")
        return i


def test_a_lone_worker_that_dies_leaves_its_child_serving_control_messages():
    # Its worker loop ends as a worker thread's does: the death is reported
    # (as with threads), the child goes on reading its queue until told to
    # stop, and stopping takes no longer than with a live worker.
    def outcome(**kw):
        it = iter(ThreadDataLoader(_DiesOfABaseException(), batch_size=None, num_workers=2, timeout=20, **kw))
        got = []
        try:
            for x in it:
                got.append(int(x))
        except BaseException as e:  # noqa: BLE001 - compared
            got.append(f"{type(e).__name__}: {e}")
        started = time.monotonic()
        del it
        return got, time.monotonic() - started

    threads, _ = outcome(worker_processes=0)
    processes, stop_s = outcome(worker_processes=2, multiprocessing_context=FORK)
    assert processes == threads
    assert stop_s < 3.0


# --- the wire ----------------------------------------------------------------------------

def test_jobs_and_results_travel_as_plain_tuples():
    job = Job(7, 2, [1, 2, 3])
    sent = wire.job_message(1, job)
    data = ForkingPickler.dumps(sent)
    assert b"Job" not in data and wire.job_of(ForkingPickler.loads(data)[1]) == job

    class Results:
        def put(self, msg):
            self.msg = ForkingPickler.loads(ForkingPickler.dumps(msg))
            self.data = ForkingPickler.dumps(msg)

    results = Results()
    parcels = wire.ParcelQueue(results)
    parcels.put(Message(Kind.DATA, 3, 5, 1, {"x": 1}))
    assert b"Kind" not in results.data and b"Parcel" not in results.data
    got = wire.received(results.msg)
    assert got[:4] == (Kind.DATA, 3, 5, 1) and type(got.kind) is Kind
    assert type(got.payload) is wire.Parcel and got.payload.open() == {"x": 1} and got.payload.pid == os.getpid()
    parcels.put(Message(Kind.SYNCED, 3, -1, 1, None))
    assert wire.received(results.msg) == (Kind.SYNCED, 3, -1, 1, None)


def test_a_message_no_child_sends_fails_to_be_received():
    with pytest.raises(Exception):  # noqa: B017 - any: the receiver takes it for a broken channel
        wire.received((99, 0, 0, 0, None))


# --- one poll per wait ---------------------------------------------------------------------

@pytest.mark.parametrize("with_poll", [True, False], ids=["poll", "connection.wait"])
def test_readers_report_data_and_ends_of_file(with_poll, monkeypatch):
    if not with_poll:
        monkeypatch.delattr(select, "poll")
    a_reader, a_writer = mp_connection.Pipe(duplex=False)
    b_reader, b_writer = mp_connection.Pipe(duplex=False)
    try:
        watched = readers.Readers([a_reader, b_reader])
        assert len(watched) == 2
        started = time.monotonic()
        assert watched.wait(0.05) == []
        assert time.monotonic() - started >= 0.04
        b_writer.send_bytes(b"x")
        assert watched.wait(1.0) == [b_reader]
        assert b_reader.recv_bytes() == b"x"
        a_writer.close()  # an end of file counts as ready: reading it says so
        assert watched.wait(1.0) == [a_reader]
        with pytest.raises(EOFError):
            a_reader.recv_bytes()
        watched.remove(a_reader)
        watched.remove(a_reader)  # idempotent
        assert len(watched) == 1 and watched.wait(0.0) == []
    finally:
        for conn in (a_reader, b_reader, b_writer):
            conn.close()


class _Marker(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _ThreadState(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        n = torch._C._len_torch_function_stack()
        modes = [type(torch._C._get_function_stack_at(k)).__name__ for k in range(n)]
        return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), torch.is_autocast_enabled("cpu"),
                "_Marker" in modes)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("num_workers", [2, 4], ids=["lone-worker", "worker-threads"])
def test_a_lone_worker_starts_as_a_worker_thread_does_not_as_the_forked_main_thread(mode, num_workers):
    # A forked child's main thread is a copy of the loader's thread: a lone
    # worker run there leaves what worker threads do not inherit (inference
    # mode, carried as grad mode off; torch function modes; autocast).
    enter = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[mode]
    loader = ThreadDataLoader(_ThreadState(), batch_size=None, num_workers=num_workers, worker_processes=2,
                              multiprocessing_context=FORK)
    with enter(), torch.autocast("cpu"), _Marker():
        got = list(loader)
    assert [list(s) for s in got] == [[False, False, False, False]] * 4
