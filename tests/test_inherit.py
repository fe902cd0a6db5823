"""Worker threads start in the state a forked worker process inherits from the thread calling iter()."""

from __future__ import annotations

import contextlib
import contextvars
import decimal
import multiprocessing

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from threadloader import ThreadDataLoader

needs_fork = pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")

USER_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("user_var", default="unset")


class ReportsState(Dataset):
    """Each sample: the worker's grad/inference mode, NumPy error state, decimal precision, a context variable."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> tuple:
        return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), np.geterr()["divide"],
                decimal.getcontext().prec, USER_VAR.get())


@contextlib.contextmanager
def caller_state(mode: str):
    modes = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode, "enable_grad": torch.enable_grad}
    token = USER_VAR.set("set by the caller")
    try:
        with modes[mode](), np.errstate(divide="raise"), decimal.localcontext(decimal.Context(prec=50)):
            yield
    finally:
        USER_VAR.reset(token)


def run(make, mode: str) -> list:
    with caller_state(mode):
        return list(make())


@needs_fork
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "enable_grad"])
@pytest.mark.parametrize("worker_processes", [0, 2])
def test_workers_run_in_the_callers_modes_as_forked_workers_do(mode, worker_processes):
    # A validation loop under torch.no_grad() whose dataset runs a module: the
    # forked DataLoader workers run it without autograd; new threads started
    # with grad on, NumPy's and decimal's defaults.
    kwargs = dict(batch_size=None, num_workers=2, multiprocessing_context="fork")
    want = run(lambda: DataLoader(ReportsState(), **kwargs), mode)
    got = run(lambda: ThreadDataLoader(ReportsState(), worker_processes=worker_processes, **kwargs), mode)
    if mode == "inference_mode":
        # Carried as grad mode off: the workers' tensors are no inference tensors (see below).
        assert {s[1] for s in want} == {True}
        want = [[s[0], False, *s[2:]] for s in want]
    assert got == want
    assert list(want[0][2:]) == ["raise", 50, "set by the caller"]  # the oracle did inherit them


class Images(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((3,), float(i))


def test_workers_started_under_inference_mode_serve_a_training_epoch():
    # Persistent workers first iterated under inference_mode (statistics, a
    # sanity check), then a training epoch: its batches must be usable by
    # autograd, as a worker process's batches (rebuilt in the parent) are.
    loader = ThreadDataLoader(Images(), batch_size=2, num_workers=2, persistent_workers=True)
    with torch.inference_mode():
        list(loader)
    weight = torch.ones(3, requires_grad=True)
    for batch in loader:
        assert not batch.is_inference()
        (batch * weight).sum().backward()
    assert weight.grad is not None


def test_state_is_taken_when_the_workers_start_and_persists_with_them():
    # Persistent workers keep the state of the iter() that started them, as
    # forked persistent workers keep theirs.
    loader = ThreadDataLoader(ReportsState(), batch_size=None, num_workers=2, persistent_workers=True)
    with torch.no_grad():
        first = list(loader)
    second = list(loader)
    assert {s[0] for s in first} == {s[0] for s in second} == {False}
    fresh = ThreadDataLoader(ReportsState(), batch_size=None, num_workers=2)
    assert {s[0] for s in fresh} == {True}


class ChangesDecimal(Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> int:
        decimal.getcontext().prec = 7
        decimal.getcontext().traps[decimal.DivisionByZero] = False
        return decimal.getcontext().prec


def test_a_workers_changes_to_the_decimal_context_stay_in_the_worker():
    # The inherited context is the worker's own copy, as in a worker process.
    with decimal.localcontext(decimal.Context(prec=40)) as ctx:
        assert list(ThreadDataLoader(ChangesDecimal(), batch_size=None, num_workers=2)) == [7, 7]
        assert ctx.prec == 40 and decimal.getcontext() is ctx
        assert ctx.traps[decimal.DivisionByZero]


def test_threadloaders_own_random_routing_is_not_inherited_by_an_inner_loaders_workers():
    # A loader iterated inside another loader's worker: the inner workers
    # draw from their own generators, as a fresh DataLoader's would.
    class Draws(Dataset):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> int:
            return int(torch.randint(0, 2**30, ()))

    def inner(seed: int) -> list:
        torch.manual_seed(seed)
        return [int(x) for x in ThreadDataLoader(Draws(), batch_size=None, num_workers=2)]

    class Outer(Dataset):
        def __len__(self) -> int:
            return 1

        def __getitem__(self, i: int) -> list:
            return inner(7)

    want = inner(7)
    out = list(ThreadDataLoader(Outer(), batch_size=None, num_workers=1))
    assert out[0] == want
