"""The adaptive default's move into the consumer's thread (``threadloader.engine.inline_pool``).

The contract suite runs every DataLoader behaviour in this mode too (``helpers.MODES``,
"inline"). Here: what only this mode has: the choice itself, the consumer's
thread state around each task, a worker's death inside the consumer's call,
and the limits (a ``timeout``).
"""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch
from helpers import DiesAt, Squares, outcomes, to_list
from torch.overrides import TorchFunctionMode
from torch.utils.data import DataLoader, Dataset, get_worker_info

from threadloader import ThreadDataLoader
from threadloader._platform.interpreter import gil_enabled
from threadloader.adaptive import policy
from threadloader.engine.inline_pool import InlinePool
from threadloader.engine.protocol import Mode

pytestmark = pytest.mark.usefixtures("no_leaks")

#: The cost of the hand-offs is measured where the GIL makes threads take turns. Without it the
#: default stays on threads (threads run in parallel there); the moves asked for are tested there too.
needs_gil = pytest.mark.skipif(not gil_enabled(), reason="the hand-offs' cost is measured with the GIL on")


@pytest.fixture(autouse=True)
def eligible_without_a_gil(monkeypatch):
    # On a free-threaded build the default stays on threads; the moves here are measured or asked for.
    monkeypatch.setattr(policy, "gil_enabled", lambda: True)


class Cheap(Dataset):
    """A map-style dataset whose samples cost a microsecond or two of Python, with random draws."""

    def __init__(self, n: int = 3000) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return i, random.random(), get_worker_info().id


def _epochs(loader, epochs: int = 2) -> list:
    return [to_list(batch) for _ in range(epochs) for batch in loader]


def _oracle(dataset, epochs: int = 2, **kwargs) -> list:
    torch.manual_seed(0)
    return _epochs(DataLoader(dataset, **kwargs), epochs)


def _ours(dataset, epochs: int = 2, **kwargs):
    torch.manual_seed(0)
    loader = ThreadDataLoader(dataset, **kwargs)
    return loader, _epochs(loader, epochs)


@needs_gil
@pytest.mark.parametrize("persistent", [False, True])
def test_cheap_tasks_move_into_the_consumers_thread_with_dataloaders_batches(persistent):
    kwargs = dict(batch_size=None, shuffle=True, num_workers=2, persistent_workers=persistent)
    loader, got = _ours(Cheap(), **kwargs)
    assert got == _oracle(Cheap(), **kwargs)
    mode = loader.stats().mode
    assert mode.startswith("inline (adaptive: the 2 workers moved into the consumer's thread"), mode
    assert "the hand-offs between threads cost more than the tasks" in mode
    assert not [t for t in threading.enumerate() if t.name.startswith("threadloader-worker")]


def test_tasks_that_cost_more_than_their_hand_offs_stay_threads():
    watch = policy.HandoffWatch([_Counters()])
    counters = watch._counters[0]
    for _ in range(3 * policy.INLINE_CHECK_EVERY):
        counters.tasks += 1
        counters.fetch_s += 20e-6
        assert not watch.add(30e-6)  # a task costs more than half the consumer's time per result
    assert watch.task_s == pytest.approx(20e-6) and watch.wait_s == pytest.approx(30e-6)
    for _ in range(policy.INLINE_CHECK_EVERY - 1):
        counters.tasks += 1
        counters.fetch_s += 2e-6
        assert not watch.add(30e-6)
    counters.tasks += 1
    counters.fetch_s += 2e-6
    assert watch.add(30e-6)


def test_the_workers_go_back_to_threads_when_a_result_costs_more_than_with_threads():
    watch = policy.InlineWatch(threads_s=30e-6)
    for _ in range(policy.INLINE_CHECK_EVERY):
        assert not watch.add(1.0)  # the move itself
    for _ in range(policy.INLINE_CHECK_EVERY):
        assert not watch.add(29e-6)
    for _ in range(policy.BACK_AFTER_LOOKS - 1):  # a busy moment is no reason to go back
        for _ in range(policy.INLINE_CHECK_EVERY):
            assert not watch.add(31e-6)
    for _ in range(policy.INLINE_CHECK_EVERY):
        assert not watch.add(29e-6)
    for _ in range(policy.BACK_AFTER_LOOKS * policy.INLINE_CHECK_EVERY - 1):
        assert not watch.add(31e-6)
    assert watch.add(31e-6)
    assert watch.inline_s == pytest.approx(31e-6)


class GrowsDear(Dataset):
    """Cheap samples first, then samples that take longer than any hand-off."""

    def __init__(self, n: int = 2400, cheap: int = 1200) -> None:
        self.n, self.cheap = n, cheap

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        drawn = 0.0
        if i >= self.cheap:
            time.sleep(0.0005)
            drawn = torch.rand(1).item()  # the torch stream goes on in the threads
        return i, random.random(), drawn, get_worker_info().id


@needs_gil
def test_workers_whose_tasks_grow_dear_go_back_to_threads_with_dataloaders_batches():
    kwargs = dict(batch_size=None, num_workers=2)
    loader, got = _ours(GrowsDear(), epochs=1, **kwargs)
    assert got == _oracle(GrowsDear(), epochs=1, **kwargs)
    mode = loader.stats().mode
    assert mode.startswith("threads (adaptive: back on threads"), mode
    assert "in the consumer's thread a result took" in mode


def test_only_tasks_cheaper_than_a_few_hand_offs_move():
    assert policy.worth_inlining(5e-6, 10e-6)
    assert not policy.worth_inlining(6e-6, 10e-6)
    # A slow training loop behind a slow consumer: its tasks would delay it by all their time.
    assert not policy.worth_inlining(2 * policy.MAX_INLINE_TASK_S, 1.0)


class _Counters:
    tasks = 0
    fetch_s = collate_s = pin_s = 0.0


def test_a_loader_with_a_timeout_never_runs_tasks_in_the_consumers_thread(monkeypatch):
    monkeypatch.setenv(policy.INLINE_AFTER_ENV, "1")
    loader = ThreadDataLoader(Squares(12), batch_size=2, num_workers=2, timeout=5)
    assert len(to_list(loader)) == 6
    assert loader.stats().mode == "threads (adaptive: the workers move into processes if they hold the GIL)"


def test_both_move_variables_set_is_an_error(monkeypatch):
    monkeypatch.setenv(policy.INLINE_AFTER_ENV, "1")
    monkeypatch.setenv(policy.MOVE_AFTER_ENV, "1")
    with pytest.raises(ValueError, match="THREADLOADER_INLINE_AFTER and THREADLOADER_MOVE_AFTER are both set"):
        iter(ThreadDataLoader(Squares(4), num_workers=2))


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_checkpoint_taken_next_to_the_move_resumes_dataloaders_epoch(when):
    kwargs = dict(batch_size=4, shuffle=True, num_workers=2)
    expected = _oracle(Squares(40), **kwargs)
    torch.manual_seed(0)
    loader = ThreadDataLoader(Squares(40), **kwargs)
    it = iter(loader)
    got = [to_list(next(it)) for _ in range(3)]
    if when == "before":
        state = loader.state_dict()
        assert it._pool.move(Mode.INLINE)
    else:
        assert it._pool.move(Mode.INLINE)
        state = loader.state_dict()
    got.append(to_list(next(it)))
    assert to_list(it) == expected[4:10]  # the move completes once the consumer waits
    assert loader.stats().mode.startswith("inline")
    del it
    resumed = ThreadDataLoader(Squares(40), **kwargs)
    resumed.load_state_dict(state)
    assert got[:3] + _epochs(resumed) == expected


class Probe(Dataset):
    """What a task sees of its thread's torch state."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        x = torch.ones(1)
        return torch.is_grad_enabled(), torch.is_inference_mode_enabled(), type(x + 1).__name__, \
            torch.is_autocast_enabled("cpu")


class _Wrap(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        raise AssertionError("a worker's torch call went through the training loop's function mode")


def test_each_task_runs_in_the_thread_state_the_workers_started_in(monkeypatch):
    monkeypatch.setenv(policy.INLINE_AFTER_ENV, "0")
    loader = ThreadDataLoader(Probe(), batch_size=None, num_workers=2)
    it = iter(loader)
    with torch.no_grad():
        first = next(it)  # the move completes in the first wait
    assert loader.stats().mode.startswith("inline")
    with torch.inference_mode():
        second = next(it)
    with _Wrap(), torch.autocast("cpu"):
        third = next(it)
        assert torch.is_autocast_enabled("cpu")  # given back after the task
    assert first == second == third == [True, False, "Tensor", False]  # default_convert makes lists of tuples
    assert list(it) == [[True, False, "Tensor", False]]


def test_a_worker_that_dies_in_the_consumers_call_is_dataloaders_dead_worker(monkeypatch):
    monkeypatch.setenv(policy.INLINE_AFTER_ENV, "0")
    loader = ThreadDataLoader(DiesAt(SystemExit(3)), batch_size=None, num_workers=2)
    # As DataLoader's: the error where the dead worker's task was due, then the other worker's tasks.
    assert outcomes(loader) == [0, 1, "exited", 3, 5, "StopIteration"]
    assert loader.stats().mode.startswith("inline")


def test_keyboard_interrupt_in_a_task_reaches_the_training_loop(monkeypatch):
    monkeypatch.setenv(policy.INLINE_AFTER_ENV, "0")
    loader = ThreadDataLoader(DiesAt(KeyboardInterrupt()), batch_size=None, num_workers=2)
    it = iter(loader)
    assert [next(it), next(it)] == [0, 1]
    with pytest.raises(KeyboardInterrupt):
        next(it)
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(thread 0\) exited unexpectedly"):
        next(it)
    it._shutdown_workers()


def test_the_workers_look_alive_until_shut_down(monkeypatch):
    monkeypatch.setenv(policy.INLINE_AFTER_ENV, "0")
    it = iter(ThreadDataLoader(Squares(8), batch_size=2, num_workers=2))
    next(it)
    assert isinstance(it._pool._current, InlinePool)
    workers = it._workers
    assert [w.is_alive() for w in workers] == [True, True]
    assert [w.name for w in workers] == ["threadloader-worker-0", "threadloader-worker-1"]
    it._shutdown_workers()
    assert [w.is_alive() for w in workers] == [False, False]
    assert [w.exitcode for w in workers] == [0, 0]


class Finalized(Dataset):
    """Records when a worker's copy is finalized (its ``__del__``, as a worker process's exit runs it)."""

    finalized: list[int] = []

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> int:
        self.worker = get_worker_info().id
        return i

    def __del__(self) -> None:
        if hasattr(self, "worker"):
            Finalized.finalized.append(self.worker)


def test_the_copies_the_workers_go_on_with_are_finalized_once_they_stop(monkeypatch):
    monkeypatch.setenv(policy.INLINE_AFTER_ENV, "1")
    Finalized.finalized.clear()
    it = iter(ThreadDataLoader(Finalized(), batch_size=2, num_workers=2))
    assert [next(it).tolist() for _ in range(6)][:2] == [[0, 1], [2, 3]]
    assert isinstance(it._pool._current, InlinePool)
    assert Finalized.finalized == []  # the threads ended, but their copies go on here
    it._shutdown_workers()
    assert sorted(Finalized.finalized) == [0, 1]
