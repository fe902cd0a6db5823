"""DataPipe datasets (``torch.utils.data.datapipes``): the batches DataLoader gives, with threads and processes."""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers import to_list
from hypothesis import given
from hypothesis import strategies as st
from test_resume import _checkpoint_between_epochs, interrupted, uninterrupted
from torch.utils.data import DataLoader, get_worker_info

from threadloader import ThreadDataLoader

datapipes = pytest.importorskip("torch.utils.data.datapipes")
from torch.utils.data.datapipes.iter import IterableWrapper  # noqa: E402
from torch.utils.data.datapipes.map import SequenceWrapper  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# (num_workers, worker_processes)
WORKERS = [(0, 0), (2, 0), (3, 0), (3, 2)]


def times_ten(x):
    return x * 10


def iter_pipe(n=23):
    """Shuffled, then sharded: every worker must shuffle alike (the shared seed) and keep its own shard."""
    return IterableWrapper(range(n)).shuffle().sharding_filter().map(times_ten)


def map_pipe(n=17):
    return SequenceWrapper(range(n)).map(times_ten)


def epochs(cls, make_pipe, epochs=2, seed=0, use_generator=False, **kwargs):
    torch.manual_seed(seed)
    if use_generator:
        kwargs["generator"] = torch.Generator().manual_seed(seed + 1)
    loader = cls(make_pipe(), **kwargs)
    return [to_list(loader) for _ in range(epochs)]


def extra(num_workers, processes):
    return {"worker_processes": processes} if processes else {}


@pytest.mark.parametrize("num_workers,processes", WORKERS)
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("shuffle", [None, False, True])
def test_iterable_datapipe_gives_dataloaders_batches(num_workers, processes, persistent, shuffle):
    if persistent and not num_workers:
        pytest.skip("persistent workers need workers")
    kwargs = dict(batch_size=3, num_workers=num_workers, persistent_workers=persistent, shuffle=shuffle)
    expected = epochs(DataLoader, iter_pipe, epochs=3, **kwargs)
    got = epochs(ThreadDataLoader, iter_pipe, epochs=3, **kwargs, **extra(num_workers, processes))
    assert got == expected
    # Each epoch holds every element once: the workers sharded one shuffled order.
    assert all(sorted(sum(e, [])) == [10 * i for i in range(23)] for e in got)


@pytest.mark.parametrize("num_workers,processes", WORKERS)
@pytest.mark.parametrize("shuffle", [False, True])
def test_map_datapipe_gives_dataloaders_batches(num_workers, processes, shuffle):
    kwargs = dict(batch_size=4, num_workers=num_workers, shuffle=shuffle, use_generator=True)
    expected = epochs(DataLoader, map_pipe, **kwargs)
    assert epochs(ThreadDataLoader, map_pipe, **kwargs, **extra(num_workers, processes)) == expected


@given(n=st.integers(0, 30), batch_size=st.one_of(st.none(), st.integers(1, 5)), num_workers=st.integers(1, 4),
       drop_last=st.booleans(), use_generator=st.booleans(), seed=st.integers(0, 2**16))
def test_iterable_datapipe_matches_dataloader(n, batch_size, num_workers, drop_last, use_generator, seed):
    kwargs = dict(batch_size=batch_size, num_workers=num_workers, drop_last=drop_last and batch_size is not None,
                  shuffle=True, use_generator=use_generator, seed=seed)

    def make():
        return iter_pipe(n)

    assert epochs(ThreadDataLoader, make, **kwargs) == epochs(DataLoader, make, **kwargs)


def test_the_users_worker_init_fn_runs_after_sharding_on_the_workers_own_graph():
    seen = {}

    def init(worker_id):
        info = get_worker_info()
        seen[worker_id] = sorted(info.dataset)  # its shard: the graph was sharded before this ran

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = ThreadDataLoader(IterableWrapper(range(10)).sharding_filter(), batch_size=2, num_workers=2,
                                  worker_init_fn=init)
        batches = to_list(loader)
    assert seen == {0: [0, 2, 4, 6, 8], 1: [1, 3, 5, 7, 9]}
    assert sorted(sum(batches, [])) == list(range(10))
    assert list(loader.dataset) == list(range(10))  # the loader's own graph was not sharded


@pytest.mark.parametrize("num_workers,processes", [(2, 0), (3, 2)])
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("stop_epoch,stop_batch", [(0, 2), (1, 3)])
def test_resume_mid_epoch_gives_the_uninterrupted_batches(num_workers, processes, persistent, stop_epoch, stop_batch):
    def make():
        return ThreadDataLoader(iter_pipe(), batch_size=2, num_workers=num_workers, persistent_workers=persistent,
                                shuffle=True, **extra(num_workers, processes))

    assert interrupted(make, stop_epoch, stop_batch) == uninterrupted(make)


@pytest.mark.parametrize("use_generator", [False, True])
def test_resume_between_epochs_of_persistent_workers(use_generator):
    def make():
        gen = torch.Generator().manual_seed(5) if use_generator else None
        return ThreadDataLoader(iter_pipe(), batch_size=2, num_workers=2, persistent_workers=True, shuffle=True,
                                generator=gen)

    assert _checkpoint_between_epochs(make) == uninterrupted(make)
