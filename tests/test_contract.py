"""DataLoader's contract, once for every execution mode (threads, ``worker_processes``).

Each test takes a ``mode`` (:data:`helpers.MODES`): the ThreadDataLoader
arguments that choose how its workers run. What a mode must do is what
DataLoader does, so the tests say it once; a new mode is one more entry of
``MODES``. Grouped by behaviour: arguments, batches, order, worker copies and randomness,
errors, a worker's death, shutdown, resume.
"""

from __future__ import annotations

import functools
import gc
import inspect
import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
from conftest import wait_no_worker_threads, worker_threads
from helpers import (
    MODES,
    DictProxy,
    DiesAt,
    Failing,
    Mode,
    OwnGenerators,
    Sharded,
    Slow,
    Squares,
    assert_same_as_dataloader,
    child_processes,
    no_sigchld_handler,
    outcomes,
    to_list,
)
from torch.utils.data import DataLoader, Dataset, IterableDataset, SequentialSampler, get_worker_info

from threadloader import ThreadDataLoader

# Every test: no child process, thread, file descriptor or /dev/shm entry left behind.
pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.fixture(params=MODES, ids=str)
def mode(request, monkeypatch) -> Mode:
    for name, value in request.param.env.items():
        monkeypatch.setenv(name, value)
    return request.param


# --- arguments ------------------------------------------------------------------------------

@pytest.mark.parametrize("in_order", [False, True])
def test_a_loader_rebuilt_from_its_attributes_is_the_same_loader(mode, in_order):
    # What Lightning and Accelerate do: read each __init__ parameter back from
    # the attribute of the same name and build a new instance of the class.
    loader = ThreadDataLoader(Squares(11), batch_size=None, sampler=SequentialSampler(range(11)), num_workers=2,
                              prefetch_factor=3, timeout=5, in_order=in_order, **mode.kwargs(2))
    params = inspect.signature(type(loader).__init__).parameters
    kwargs = {n: getattr(loader, n) for n in params if n != "self" and hasattr(loader, n) and n != "shuffle"}
    kwargs["batch_sampler"] = None
    clone = type(loader)(**kwargs)
    assert type(clone) is ThreadDataLoader
    assert clone.prefetch_factor == 3 and clone.timeout == 5 and clone.in_order is in_order
    assert clone.worker_processes == loader.worker_processes == mode.kwargs(2).get("worker_processes")
    assert sorted(to_list(clone)) == sorted(to_list(loader))
    expected = to_list(DataLoader(Squares(11), batch_size=None, sampler=SequentialSampler(range(11))))
    got = to_list(clone)
    assert (got if in_order else sorted(got)) == expected


@pytest.mark.parametrize("value,error", [(-1, AssertionError), (2.0, TypeError)])
def test_num_workers_made_invalid_after_construction_fails_as_in_dataloader(mode, value, error):
    errors = []
    for cls, kw in ((DataLoader, {}), (ThreadDataLoader, mode.kwargs(2))):
        loader = cls(Squares(4), num_workers=2, **kw)
        loader.num_workers = value
        with pytest.raises(error) as info:
            iter(loader)
        errors.append(str(info.value))
    assert errors[0] == errors[1]
    if value == -1:
        assert errors[0] == "num_workers must be greater than 0 for MultiProcessingDataLoaderIter"


# --- batches --------------------------------------------------------------------------------

class _MixedSamples(Dataset):
    """Samples whose dtypes differ, or that require grad: default_collate's edge cases in workers."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.kind == "grad":
            return torch.ones(2, requires_grad=True)
        if self.kind == "ndarray":  # a tensor, then an array at the same position
            return torch.ones(2) if i % 2 == 0 else np.ones(2)
        if self.kind == "conj":
            return (torch.ones(2, dtype=torch.complex64) * 1j).conj()
        if self.kind in ("shrinking", "growing"):  # sizes differ; the batch is sized from the first
            return torch.zeros(3 - i % 2 if self.kind == "shrinking" else 2 + i % 2)
        first = torch.float32 if self.kind == "float" else torch.int64
        return torch.tensor([i, i + 0.5], dtype=first if i % 2 == 0 else torch.float64)


def _collate_outcome(cls, kind: str, num_workers: int, **kw):
    it = iter(cls(_MixedSamples(kind), batch_size=2, num_workers=num_workers, **kw))
    try:
        return [(b.dtype, b.tolist()) for b in it]
    except (TypeError, RuntimeError, AttributeError) as e:
        return type(e), str(e).strip().splitlines()[-1]
    finally:
        # Left to the garbage collector in the error's traceback cycle,
        # DataLoader's iterator takes 5 s to stop its worker.
        it._shutdown_workers()


@functools.lru_cache(maxsize=None)
def _dataloader_collate_outcome(kind: str):
    # One worker process: the batch's typing does not depend on the count.
    return _collate_outcome(DataLoader, kind, 1, multiprocessing_context="fork")


@pytest.mark.parametrize("kind", ["float", "long", "grad", "ndarray", "conj", "shrinking", "growing"])
def test_default_collate_in_workers_types_the_batch_as_dataloader_workers(mode, kind):
    # A DataLoader worker stacks into a batch of the first sample's dtype
    # (``out=``): float32 then float64 gives float32, a float sample cannot go
    # into a Long batch, and samples requiring grad are refused. Sizing the
    # batch asks every sample for numel() (an array has none), a conjugate
    # view cannot make the batch tensor, and a storage of all the samples'
    # items cannot be resized to hold len(batch) first samples.
    expected = _dataloader_collate_outcome(kind)
    assert _collate_outcome(ThreadDataLoader, kind, 2, **mode.kwargs(1)) == expected


class _NoGetitems(Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i])


def _batched_reader(worker_id: int) -> None:
    # This worker's copy of the dataset gets a batched reader of its own.
    torch.utils.data.get_worker_info().dataset.__getitems__ = lambda indices: [("batched", int(i)) for i in indices]


def test_a_getitems_given_to_the_worker_copy_in_worker_init_fn_is_used_as_in_dataloader(mode):
    # torch's fetcher asks the worker's own dataset for __getitems__ at each
    # fetch; ours decided once, from the loader's dataset.
    def batches(cls, **kw):
        return repr(list(cls(_NoGetitems(), batch_size=2, num_workers=2, worker_init_fn=_batched_reader, **kw)))

    expected = batches(DataLoader, multiprocessing_context="fork")
    assert "batched" in expected
    assert batches(ThreadDataLoader, **mode.kwargs(1)) == expected


# --- order ----------------------------------------------------------------------------------

@pytest.mark.parametrize("persistent", [False, True])
def test_a_shuffled_dataset_gives_dataloaders_batches_and_random_draws(mode, persistent):
    assert_same_as_dataloader(Squares(23), mode, epochs=2, seed=7, batch_size=4, shuffle=True, num_workers=3,
                              persistent_workers=persistent)


@pytest.mark.parametrize("num_workers,processes", [(1, 1), (3, 2), (4, 2)])
@pytest.mark.parametrize("batch_size,drop_last", [(None, False), (3, False), (3, True)])
def test_an_iterable_dataset_gives_dataloaders_batches_every_epoch(mode, num_workers, processes, batch_size,
                                                                   drop_last):
    # Each worker iterates its own replica, sharded by worker info; persistent
    # workers start each epoch's replica again.
    batches = assert_same_as_dataloader(Sharded(0, 29, uneven=True), mode, epochs=2, processes=processes,
                                        oracle=dict(persistent_workers=False), check_rng=False, batch_size=batch_size,
                                        drop_last=drop_last, num_workers=num_workers, persistent_workers=True)
    assert batches[0] == batches[1]


class _StopsInCollate(IterableDataset):
    def __iter__(self):
        return iter(range(6))


def _stop_in_worker_0(batch):
    if torch.utils.data.get_worker_info().id == 0 and 2 in batch:
        raise StopIteration  # e.g. next() on an exhausted helper iterator
    return torch.tensor(batch)


def test_stop_iteration_from_collate_ends_that_iterable_replica_as_in_dataloader(mode):
    expected = to_list(DataLoader(_StopsInCollate(), batch_size=2, num_workers=2, collate_fn=_stop_in_worker_0))
    got = to_list(ThreadDataLoader(_StopsInCollate(), batch_size=2, num_workers=2, collate_fn=_stop_in_worker_0,
                                   **mode.kwargs(1)))
    assert expected == [[0, 1], [0, 1], [2, 3], [4, 5]]
    assert got == expected


# --- worker copies and randomness -----------------------------------------------------------

class _SharesTheLoadersGenerator(Dataset):
    """Draws from the generator the loader shuffles with; copying it is slow (a big dataset's would be)."""

    def __init__(self, generator: torch.Generator) -> None:
        self.g = generator

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> float:
        return torch.rand((), generator=self.g).item()

    def __copy__(self):
        time.sleep(0.2)
        clone = type(self).__new__(type(self))
        clone.__dict__.update(self.__dict__)
        return clone


def test_workers_copy_the_dataset_before_the_epoch_draws_its_order(mode):
    # A worker process's copy of the dataset (and of a generator it shares
    # with the sampler) is taken when the workers start, before the sampler
    # draws. Worker threads copied it in their own thread, at any time: a slow
    # copy came after the draw, and the same seed gave other samples.
    def batches(cls, **kw):
        g = torch.Generator().manual_seed(7)
        loader = cls(_SharesTheLoadersGenerator(g), batch_size=2, shuffle=True, generator=g, num_workers=2, **kw)
        return [b.tolist() for b in loader]

    expected = batches(DataLoader, multiprocessing_context="fork")
    assert batches(ThreadDataLoader, **mode.kwargs(1)) == expected


def test_generators_a_dataset_holds_are_each_workers_own(mode):
    # In DataLoader every worker process draws from its own copy of them: the
    # same batches on every run. Shared by threads, the draws would go in
    # whatever order the threads run.
    ds = OwnGenerators()
    oracle = [to_list(b) for b in DataLoader(ds, batch_size=2, num_workers=2)]
    for _ in range(2):
        ours = [to_list(b) for b in ThreadDataLoader(ds, batch_size=2, num_workers=2, **mode.kwargs(1))]
        assert ours == oracle
    assert ds.np_rng.random() == np.random.default_rng(0).random()  # the loader's dataset keeps its own


# --- errors ---------------------------------------------------------------------------------

def test_a_samples_error_is_raised_in_its_turn_with_its_traceback_and_the_iterator_goes_on(mode):
    it = iter(ThreadDataLoader(Failing(8, {2}), batch_size=2, num_workers=2, **mode.kwargs(2)))
    assert next(it).tolist() == [0, 1]
    with pytest.raises(ValueError) as info:
        next(it)
    msg = str(info.value)
    assert "Caught ValueError in DataLoader worker thread" in msg
    assert "dataset index 2" in msg
    assert "Original Traceback" in msg and "bad sample 2" in msg and "__getitem__" in msg
    assert next(it).tolist() == [4, 5]  # usable afterwards, as DataLoader's iterator is
    assert next(it).tolist() == [6, 7]
    with pytest.raises(StopIteration):
        next(it)


def _init_raising_runtime_error(worker_id):
    raise RuntimeError(f"init failed in {worker_id}")


def _init_raising_key_error(worker_id):
    raise KeyError("no init")


@pytest.mark.parametrize("init,exc,match,processes", [
    (_init_raising_runtime_error, RuntimeError, "(?s)worker_init_fn.*init failed in", 2),
    (_init_raising_key_error, KeyError, "worker_init_fn", 1),  # two worker threads in one process
], ids=["first_batch", "whole_epoch"])
def test_a_worker_init_fn_error_reaches_the_user(mode, init, exc, match, processes):
    loader = ThreadDataLoader(Squares(4), batch_size=2, num_workers=2, worker_init_fn=init,
                              **mode.kwargs(processes))
    with pytest.raises(exc, match=match):
        if exc is RuntimeError:
            next(iter(loader))
        else:
            list(loader)


def test_timeout_raises_dataloaders_error_on_time(mode):
    loader = ThreadDataLoader(Slow(4, 3.0), batch_size=None, num_workers=1, timeout=0.3, **mode.kwargs(1))
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"^DataLoader timed out after 0.3 seconds$") as info:
        next(iter(loader))
    assert time.monotonic() - t0 < 2.5  # before the sample arrives
    assert info.value.__context__ is None and info.value.__cause__ is None  # as DataLoader's


class _FailsFirstIter(IterableDataset):
    """Each worker's first ``__iter__`` fails (a shard not there yet); later epochs find it."""

    def __init__(self) -> None:
        self.calls: dict[int, int] = {}  # shared by the worker copies: one count per worker id

    def __iter__(self):
        info = get_worker_info()
        self.calls[info.id] = self.calls.get(info.id, 0) + 1
        if self.calls[info.id] == 1:
            raise OSError("shard not ready")
        return iter(range(info.id, 6, info.num_workers))


def _failing_init(worker_id):
    raise RuntimeError("init failed")


def _raises(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return e
    return None


@pytest.mark.parametrize("case", ["iterable_iter", "map_worker_init_fn"])
def test_a_persistent_workers_setup_failure_fails_its_epoch_only_as_in_dataloader(mode, case):
    # DataLoader's persistent workers build their fetcher again when the next epoch starts.
    def run(cls, **kw):
        if case == "iterable_iter":
            dataset, init = _FailsFirstIter(), None
        else:
            dataset, init = Squares(6), _failing_init
        loader = cls(dataset, batch_size=None, num_workers=2, persistent_workers=True, worker_init_fn=init,
                     **{"multiprocessing_context": "fork", **kw})
        it = iter(loader)
        try:
            first = [type(_raises(lambda: next(it))).__name__ for _ in range(2)]  # each worker's first task
            return first, sorted(to_list(loader))
        finally:
            # Left to the garbage collector after the errors, DataLoader's
            # persistent iterator takes 5 s per worker to stop.
            loader._iterator._shutdown_workers()

    expected = run(DataLoader)
    assert run(ThreadDataLoader, **mode.kwargs(1)) == expected
    assert len(expected[1]) == 6  # the second epoch is served in full


class _ProxyMap(DictProxy, Dataset):
    def __init__(self):
        self.cfg = {}

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return i


def test_a_dataset_getattr_raising_fails_each_batch_not_the_worker(mode):
    # torch's fetcher asks for __getitems__ inside its per-batch try: each batch raises the KeyError.
    loader = ThreadDataLoader(_ProxyMap(), batch_size=2, num_workers=1, persistent_workers=True, **mode.kwargs(1))
    for _ in range(2):  # and the next epoch runs the same way
        it = iter(loader)
        for _ in range(2):
            with pytest.raises(KeyError, match="__getitems__"):
                next(it)
        with pytest.raises(StopIteration):
            next(it)


class _ListedBatches:
    """A batch sampler yielding the given items as they are."""

    def __init__(self, items: list) -> None:
        self.items = items

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


def _events(loader, limit: int = 12) -> list:
    """Each ``next()``'s batch, or an error's type and first words, until StopIteration."""
    out, it = [], iter(loader)
    for _ in range(limit):
        try:
            out.append(next(it).tolist())
        except StopIteration:
            return out + ["StopIteration"]
        except Exception as e:  # noqa: BLE001 - the error is the outcome compared
            out.append((type(e).__name__, str(e).split(" worker")[0]))
    return out


# Made in the test: DataLoader moves a tensor it sends to a worker into shared
# memory, and one made at collection would hold that descriptor ever after.
@pytest.mark.parametrize("make_bad", [lambda: 6, lambda: torch.tensor(6), lambda: None],
                         ids=["int", "0-d tensor", "None"])
def test_a_bad_index_from_a_batch_sampler_fails_its_task_only_as_in_dataloader(mode, make_bad):
    # DataLoader sends the item to a worker, whose fetch raises; the error comes
    # in that task's turn and the epoch goes on. It must not escape from the
    # prefetch on the training loop's thread, nor kill a worker thread.
    items = [[0], [1], [2], make_bad(), [4], [5]]
    expected = _events(DataLoader(Squares(8), batch_sampler=_ListedBatches(items), num_workers=2))
    got = _events(ThreadDataLoader(Squares(8), batch_sampler=_ListedBatches(items), num_workers=2,
                                   **mode.kwargs(1)))
    assert expected[3] == ("TypeError", "Caught TypeError in DataLoader")
    assert got == expected


# --- a worker's death -----------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _dead_worker_dataloader_outcomes() -> tuple:
    # 5 s: DataLoader's worker status check interval. Run once for the cases below.
    with no_sigchld_handler():
        return tuple(outcomes(DataLoader(DiesAt(SystemExit(3)), batch_size=None, num_workers=2)))


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt()], ids=["SystemExit", "KeyboardInterrupt"])
def test_dead_worker_is_skipped_after_its_error_as_dataloader_skips_a_dead_process(mode, exc):
    # DataLoader (the oracle) raises once where the dead worker's task was
    # due, then goes on with the other workers' tasks. Ours must not wait
    # forever for the dead one's.
    expected = list(_dead_worker_dataloader_outcomes())
    assert expected == [0, 1, "exited", 3, 5, "StopIteration"]
    got = outcomes(ThreadDataLoader(DiesAt(exc), batch_size=None, num_workers=2, timeout=20, **mode.kwargs(1)))
    assert got == expected


def test_persistent_loader_with_a_dead_worker_refuses_the_next_epoch(mode):
    loader = ThreadDataLoader(DiesAt(SystemExit(3)), batch_size=None, num_workers=2, timeout=20,
                              persistent_workers=True, **mode.kwargs(1))
    assert outcomes(loader) == [0, 1, "exited", 3, 5, "StopIteration"]
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(thread\(s\) 0\) exited unexpectedly"):
        iter(loader)


def test_a_worker_dying_after_break_makes_the_next_epoch_refused(mode):
    # Worker 0 dies on a task queued before the break (the abandoned epoch's
    # tasks still run). DataLoader's next epoch waits for its workers and
    # finds the dead one; so must ours, before any batch, however late it dies.
    loader = ThreadDataLoader(DiesAt(SystemExit(3), delay=0.5), batch_size=None, num_workers=2, timeout=20,
                              persistent_workers=True, **mode.kwargs(1))
    for _ in loader:
        break
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(thread\(s\) 0\) exited unexpectedly"):
        iter(loader)



def _after_a_refused_epoch(cls, **kw) -> list:
    """The first batch, then what next() gives on the iterator held from before its next epoch was refused."""
    loader = cls(DiesAt(SystemExit(3), delay=0.5), batch_size=None, num_workers=2, persistent_workers=True, **kw)
    it = iter(loader)
    try:
        first = int(next(it))
        with pytest.raises(RuntimeError, match="exited unexpectedly"):
            iter(loader)
        return [first, *outcomes(it, 4)]
    finally:
        it._shutdown_workers()


@functools.lru_cache(maxsize=None)
def _after_a_refused_epoch_in_dataloader() -> tuple:
    # 5 s: DataLoader's worker status check interval. Run once for every mode.
    with no_sigchld_handler():
        return tuple(_after_a_refused_epoch(DataLoader, multiprocessing_context="fork"))


def test_an_iterator_whose_next_epoch_was_refused_ends_as_dataloaders(mode):
    # DataLoader's _reset begins the new epoch, then waits for its workers: a
    # dead one refuses the epoch there, and next() on the iterator held from
    # before ends that new epoch, in which no task was sent. Ours kept the
    # abandoned epoch, whose results the wait had dropped: next() waited for
    # them (here: until the timeout).
    expected = list(_after_a_refused_epoch_in_dataloader())
    assert expected == [0, "StopIteration"]
    assert _after_a_refused_epoch(ThreadDataLoader, timeout=10, **mode.kwargs(1)) == expected

# --- shutdown -------------------------------------------------------------------------------

def _workers_run(it, count: int) -> bool:
    """Whether each of the iterator's ``count`` workers (a thread, or the process it runs in) is alive."""
    workers = it._workers
    return len(workers) == count and all(w.is_alive() for w in workers)


@pytest.mark.parametrize("how", ["exhaust", "break", "raise", "del", "gc", "persistent_del"])
def test_workers_stop_on_every_exit_path(mode, how):
    base = len(worker_threads())
    loader = ThreadDataLoader(Slow(60, 0.001), batch_size=2, num_workers=3, persistent_workers=how == "persistent_del",
                              **mode.kwargs(2))
    if how == "exhaust":
        assert len(list(loader)) == 30
    elif how == "break":
        for i, _ in enumerate(loader):
            if i == 3:
                break
    elif how == "raise":
        with pytest.raises(ZeroDivisionError):
            for _ in loader:
                1 / 0
    elif how == "del":
        it = iter(loader)
        next(it)
        assert _workers_run(it, 3)
        if not mode.in_children:
            assert len(worker_threads()) == base + 3
        del it
    elif how == "gc":
        it = iter(loader)
        next(it)
        cycle = {"it": it}
        cycle["self"] = cycle  # only the cycle collector frees it
        del it, cycle
        gc.collect()
    else:
        list(loader)
        assert _workers_run(loader._iterator, 3)
        if mode.in_children:
            assert len(child_processes()) >= 2
        del loader
    assert wait_no_worker_threads(2.0) == []
    # the fixture checks processes, threads, fds and /dev/shm


def test_next_after_the_workers_are_shut_down_ends_the_epoch_as_in_dataloader(mode):
    # DataLoader's _shutdown_workers marks every worker unavailable: a next()
    # skips their undone tasks and ends the epoch. Ours must not wait for ever
    # (with a timeout, it must not raise timeouts instead).
    def run(cls, **kw):
        # Sample 0 comes at once, the others late: none is received ahead at the shutdown.
        it = iter(cls(Slow(20, 0.5, slow=set(range(1, 20))), batch_size=None, num_workers=2, timeout=5, **kw))
        first = int(next(it))
        assert it._shutdown is False
        it._shutdown_workers()
        assert it._shutdown is True
        return [first, *outcomes(it, 4)]  # iter() of an iterator is itself

    assert run(ThreadDataLoader, **mode.kwargs(1)) == run(DataLoader) == [0, "StopIteration"]


def test_a_persistent_iterator_shut_down_serves_no_next_epoch(mode):
    # DataLoader fails on its closed queues; ours said nothing and waited for
    # ever for the stopped threads (timeout here: a timeout).
    loader = ThreadDataLoader(Squares(8), batch_size=2, num_workers=2, timeout=5, persistent_workers=True,
                              **mode.kwargs(1))
    next(iter(loader))
    loader._iterator._shutdown_workers()
    with pytest.raises(RuntimeError, match=r"^ThreadDataLoader's workers have been shut down"):
        iter(loader)


FORKED_PERSISTENT = textwrap.dedent(
    """
    import json, os, signal, sys
    from threadloader import ThreadDataLoader

    extra = json.loads(sys.argv[1])  # the mode's arguments
    loader = ThreadDataLoader(list(range(6)), batch_size=2, num_workers=2, persistent_workers=True, **extra)
    epoch = [b.tolist() for b in loader]
    it = iter(loader)
    next(it)  # the parent's second epoch has begun
    pid = os.fork()
    if pid == 0:
        signal.alarm(30)  # never wait for ever: SIGALRM ends the child
        try:
            next(it)
            os._exit(3)
        except RuntimeError as e:
            if "call iter(loader) here" not in str(e):
                os._exit(4)
        os._exit(0 if [b.tolist() for b in loader] == epoch == [b.tolist() for b in loader] else 5)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), [b.tolist() for b in loader] == epoch)
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_persistent_loader_iterated_in_a_forked_process_gets_workers_of_its_own(mode):
    # The forked copy waited for ever for the parent's workers (a dataset
    # holding a loader warmed up in the parent, used in DataLoader's forked
    # workers). Its iterator says so at once; iter(loader) starts its own.
    proc = subprocess.run([sys.executable, "-c", FORKED_PERSISTENT, json.dumps(mode.kwargs(1))],
                          capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "True"], proc.stderr


# --- resume ---------------------------------------------------------------------------------

@pytest.mark.parametrize("in_order", [True, False])
def test_a_resumed_epoch_gives_the_rest_of_the_interrupted_one(mode, in_order):
    def make():
        return ThreadDataLoader(Squares(30), batch_size=3, shuffle=True, num_workers=3,
                                generator=torch.Generator().manual_seed(3), in_order=in_order, **mode.kwargs(2))

    full = to_list(make())
    loader = make()
    it = iter(loader)
    head = [to_list([next(it)])[0] for _ in range(4)]
    state = loader.state_dict()
    del it, loader
    resumed = make()
    resumed.load_state_dict(state)
    rest = to_list(resumed)
    if in_order:
        assert head + rest == full
    else:
        assert sorted(map(repr, head + rest)) == sorted(map(repr, full))
