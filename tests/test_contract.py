"""DataLoader's contract, once for every execution mode (threads, ``worker_processes``).

Each test takes a ``mode`` (:data:`helpers.MODES`): the ThreadDataLoader
arguments that choose how its workers run. What a mode must do is what
DataLoader does, so the tests say it once; a new mode is one more entry of
``MODES``. Grouped by behaviour: arguments, order, errors, shutdown, resume.
"""

from __future__ import annotations

import gc
import inspect
import time

import pytest
import torch
from conftest import wait_no_worker_threads, worker_threads
from helpers import MODES, Failing, Mode, Sharded, Slow, Squares, assert_same_as_dataloader, to_list
from test_procs import _children, _fds, _shm, _wait, _warm_up  # noqa: F401 - its autouse warm-up runs here too
from torch.utils.data import DataLoader, SequentialSampler

from threadloader import ThreadDataLoader


@pytest.fixture(params=MODES, ids=str)
def mode(request, monkeypatch) -> Mode:
    for name, value in request.param.env.items():
        monkeypatch.setenv(name, value)
    return request.param


@pytest.fixture(autouse=True)
def no_leaks():
    gc.collect()
    children, fds, shm = _children(), _fds(), _shm()
    yield
    gc.collect()
    assert _wait(lambda: len(_children()) <= len(children)), f"leaked processes: {_children()}"
    assert not wait_no_worker_threads()
    assert _wait(lambda: _fds() <= fds), f"leaked file descriptors: {_fds() - fds}"
    assert _wait(lambda: _shm() <= shm), f"leaked shared memory: {_shm() - shm}"


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
            assert len(_children()) >= 2
        del loader
    assert wait_no_worker_threads(2.0) == []
    # the fixture checks processes, threads, fds and /dev/shm


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
