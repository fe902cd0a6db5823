"""ThreadDataLoader gives the batches DataLoader gives (property-based).

The oracle for map-style datasets is DataLoader itself: with ``num_workers=0``
for the broad property tests (fast, and the batch sequence does not depend on
the worker count), and with worker processes for targeted cases.
"""

from __future__ import annotations

import collections
import threading

import pytest
import torch
from helpers import Sharded, Squares, to_list
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from threadloader import ThreadDataLoader


def run_epochs(cls, dataset, epochs, seed, **kwargs):
    """Iterate ``epochs`` epochs from a fixed global seed; return batches and RNG state after.

    An exception (e.g. a sampler rejecting an empty dataset) is part of the
    outcome: both loaders must raise the same type with the same message.
    """
    torch.manual_seed(seed)
    try:
        loader = cls(dataset, **kwargs)
        out = [to_list(loader) for _ in range(epochs)]
    except Exception as exc:  # noqa: BLE001 - compared against the oracle
        out = [("raised", type(exc), str(exc))]
    return out, torch.get_rng_state()


@st.composite
def loader_args(draw):
    n = draw(st.integers(0, 40))
    kind = draw(st.sampled_from(["batch", "none", "sampler", "batch_sampler", "weighted", "subset"]))
    kwargs: dict = {}
    uses_generator = draw(st.booleans())
    gen_seed = draw(st.integers(0, 2**31))
    if kind == "batch":
        kwargs.update(batch_size=draw(st.integers(1, 9)), drop_last=draw(st.booleans()), shuffle=draw(st.booleans()))
    elif kind == "none":
        kwargs.update(batch_size=None, shuffle=draw(st.booleans()))
    elif kind == "sampler":
        kwargs.update(batch_size=draw(st.integers(1, 5)), sampler=list(reversed(range(n))))
    elif kind == "batch_sampler":
        size = draw(st.integers(1, 6))
        kwargs.update(batch_sampler=BatchSampler(SequentialSampler(range(n)), size, draw(st.booleans())))
    elif kind == "weighted" and n > 0:
        kwargs.update(batch_size=3, sampler="weighted")
    elif kind == "subset":
        kwargs.update(batch_size=2, sampler="subset")
    else:
        kwargs.update(batch_size=4)
    return n, kwargs, uses_generator, gen_seed


def materialize(kwargs, n, uses_generator, gen_seed):
    """Build fresh sampler objects (they hold RNG state) from the drawn recipe."""
    kw = dict(kwargs)
    gen = None
    if uses_generator:
        gen = torch.Generator()
        gen.manual_seed(gen_seed)
        kw["generator"] = gen
    if kw.get("sampler") == "weighted":
        kw["sampler"] = WeightedRandomSampler([1.0 + i % 3 for i in range(n)], n, generator=gen)
    elif kw.get("sampler") == "subset":
        kw["sampler"] = SubsetRandomSampler(list(range(0, n, 2)), generator=gen)
    elif isinstance(kw.get("batch_sampler"), BatchSampler):
        bs = kw["batch_sampler"]
        kw["batch_sampler"] = BatchSampler(SequentialSampler(range(n)), bs.batch_size, bs.drop_last)
    return kw


@given(
    args=loader_args(),
    num_workers=st.integers(1, 4),
    prefetch=st.integers(1, 3),
    persistent=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_same_batches_and_rng_as_dataloader(args, num_workers, prefetch, persistent, seed):
    n, kwargs, uses_generator, gen_seed = args
    dataset = Squares(n)
    # Persistent workers draw the base seed once per loader, not per epoch, so
    # their oracle is DataLoader with (forked) persistent worker processes.
    oracle = dict(num_workers=1, persistent_workers=True, multiprocessing_context="fork") if persistent else {}
    expected, rng_expected = run_epochs(
        DataLoader, dataset, 2, seed, **oracle, **materialize(kwargs, n, uses_generator, gen_seed))
    got, rng_got = run_epochs(
        ThreadDataLoader,
        dataset,
        2,
        seed,
        num_workers=num_workers,
        prefetch_factor=prefetch,
        persistent_workers=persistent,
        **materialize(kwargs, n, uses_generator, gen_seed),
    )
    assert got == expected
    assert torch.equal(rng_got, rng_expected), "global RNG consumed differently from DataLoader"


@given(
    n=st.integers(0, 50),
    batch_size=st.integers(1, 7),
    num_workers=st.integers(1, 4),
    drop_last=st.booleans(),
    seed=st.integers(0, 100),
)
def test_in_order_false_gives_the_same_multiset(n, batch_size, num_workers, drop_last, seed):
    dataset = Squares(n)
    expected, _ = run_epochs(DataLoader, dataset, 1, seed, batch_size=batch_size, shuffle=True, drop_last=drop_last)
    got, _ = run_epochs(
        ThreadDataLoader, dataset, 1, seed, batch_size=batch_size, shuffle=True, drop_last=drop_last,
        num_workers=num_workers, in_order=False,
    )
    key = lambda b: repr(b)  # noqa: E731
    assert collections.Counter(map(key, got[0])) == collections.Counter(map(key, expected[0]))


@pytest.mark.parametrize("num_workers", [1, 2, 3])
@pytest.mark.parametrize("shuffle", [False, True])
def test_matches_dataloader_with_worker_processes(num_workers, shuffle):
    dataset = Squares(23)
    kwargs = dict(batch_size=4, shuffle=shuffle, num_workers=num_workers, multiprocessing_context="fork")
    expected, rng_expected = run_epochs(DataLoader, dataset, 2, 7, **kwargs)
    got, rng_got = run_epochs(ThreadDataLoader, dataset, 2, 7, **kwargs)
    assert got == expected
    assert torch.equal(rng_got, rng_expected)


def test_same_shuffle_for_the_same_generator():
    dataset = Squares(50)

    def batches(cls, **kw):
        g = torch.Generator()
        g.manual_seed(1234)
        return to_list(cls(dataset, batch_size=5, shuffle=True, generator=g, **kw))

    assert batches(ThreadDataLoader, num_workers=3) == batches(DataLoader)


@pytest.mark.parametrize("num_workers", [1, 2, 3])
@pytest.mark.parametrize("batch_size", [None, 1, 4])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("uneven", [False, True])
def test_iterable_dataset_matches_worker_processes(num_workers, batch_size, drop_last, uneven):
    if batch_size is None and drop_last:
        pytest.skip("DataLoader forbids drop_last without batching")
    dataset = Sharded(0, 37, uneven=uneven)
    kwargs = dict(batch_size=batch_size, drop_last=drop_last, num_workers=num_workers)
    expected = to_list(DataLoader(dataset, multiprocessing_context="fork", **kwargs))
    got = to_list(ThreadDataLoader(dataset, **kwargs))
    assert got == expected


def test_iterable_dataset_in_order_false_multiset():
    dataset = Sharded(0, 101)
    expected = to_list(DataLoader(dataset, batch_size=3, num_workers=3, multiprocessing_context="fork"))
    got = to_list(ThreadDataLoader(dataset, batch_size=3, num_workers=3, in_order=False))
    assert sorted(map(repr, got)) == sorted(map(repr, expected))


def test_iterable_dataset_persistent_epochs():
    dataset = Sharded(0, 30, uneven=True)
    loader = ThreadDataLoader(dataset, batch_size=2, num_workers=3, persistent_workers=True)
    expected = to_list(DataLoader(dataset, batch_size=2, num_workers=3, multiprocessing_context="fork"))
    assert [to_list(loader) for _ in range(3)] == [expected] * 3


def test_num_workers_zero_is_dataloader_in_calling_thread():
    dataset = Squares(10)
    assert to_list(ThreadDataLoader(dataset, batch_size=3)) == to_list(DataLoader(dataset, batch_size=3))
    it = iter(ThreadDataLoader(dataset))
    assert isinstance(it, torch.utils.data.dataloader._SingleProcessDataLoaderIter)
    assert not [t for t in threading.enumerate() if t.name.startswith("threadloader-")]


class _EpochSampler(torch.utils.data.Sampler):
    """Yields indices that depend on ``set_epoch``, which Lightning calls after ``iter()``."""

    def __init__(self) -> None:
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return 2

    def __iter__(self):
        yield from (self.epoch * 2, self.epoch * 2 + 1)


class _RaisingSampler(torch.utils.data.Sampler):
    def __len__(self) -> int:
        return 3

    def __iter__(self):
        raise LookupError("sampler broke")
        yield 0


def test_num_workers_zero_asks_the_sampler_at_the_first_next_as_dataloader():
    # DataLoader's single-process iterator draws nothing at iter(): a global
    # draw or a set_epoch() in between decides the order.
    def outcome(cls):
        torch.manual_seed(0)
        it = iter(cls(Squares(8), batch_size=2, shuffle=True))
        drawn = torch.rand(1).item()
        shuffled = to_list(it)
        sampler = _EpochSampler()
        it = iter(cls(Squares(8), sampler=sampler))
        sampler.set_epoch(1)
        by_epoch = to_list(it)
        it = iter(cls(Squares(8), sampler=_RaisingSampler()))  # raises at next(), not here
        with pytest.raises(LookupError, match="sampler broke"):
            next(it)
        return shuffled, drawn, by_epoch

    assert outcome(ThreadDataLoader) == outcome(DataLoader)


def test_num_workers_zero_checkpoint_before_the_first_batch_resumes_the_same_epoch():
    torch.manual_seed(3)
    loader = ThreadDataLoader(Squares(10), batch_size=3, shuffle=True)
    it = iter(loader)
    state = loader.state_dict()
    expected = to_list(it)
    resumed = ThreadDataLoader(Squares(10), batch_size=3, shuffle=True)
    resumed.load_state_dict(state)
    assert to_list(resumed) == expected
