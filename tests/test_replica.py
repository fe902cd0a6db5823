"""Each worker's own copy of the dataset and hooks (threadloader/worker/copies.py), against DataLoader.

A DataLoader worker process has its own copy of the dataset, ``collate_fn``
and ``worker_init_fn``, and of every generator they reach, however it is
reached. These datasets reach generators in the ways a worker thread's copy
missed (a hunt with albumentations-style pipelines found them): each must give
DataLoader's batches on every run (the sleeps make the threads interleave
differently each time), and leave the user's objects untouched.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import random
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch
from conftest import wait_no_worker_threads
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate, get_worker_info

from threadloader import ThreadDataLoader
from threadloader.worker.copies import worker_dataset, worker_parts


class _Jitter:
    """A transform with its own generator."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, x: float) -> float:
        return x + float(self.rng.random())


class _Chain:
    """A list of transforms applied in turn (a ``Compose``/``OneOf``/``Sequential``)."""

    def __init__(self, *transforms) -> None:
        self.transforms = list(transforms)

    def __call__(self, x: float) -> float:
        for t in self.transforms:
            x = t(x)
        return x


class _Applies(Dataset):
    """``transform(i)`` for each index, slowly enough for the threads to interleave."""

    def __init__(self, transform, n: int = 12) -> None:
        self.transform = transform
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> float:
        time.sleep(0.001 * (i % 3))
        return self.transform(float(i))


@dataclasses.dataclass(slots=True, frozen=True)
class _SlottedJitter:
    rng: np.random.Generator

    def __call__(self, x: float) -> float:
        return x + float(self.rng.random())


class _ClassLevel(Dataset):
    rng = np.random.default_rng(7)  # in the class body: a worker process has its own copy of it

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> float:
        time.sleep(0.001 * (i % 3))
        return i + float(self.rng.random())


class _Draws(Dataset):
    """``self.draw = rng.random``: a method of a generator (a builtin method), not the generator."""

    def __init__(self) -> None:
        self.draw = random.Random(6).random

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> float:
        time.sleep(0.001 * (i % 3))
        return i + self.draw()


class _Record:
    def __init__(self, i: int) -> None:
        self.boxes = [_Box() for _ in range(64)]


class _Box:
    def __init__(self) -> None:
        self.xyxy = (0.0, 0.0, 1.0, 1.0)


class _RecordsFirst(_Applies):
    """Annotation records (64 × 64 objects: more than the search's budget) before the transform."""

    def __init__(self) -> None:
        self.records = [_Record(i) for i in range(64)]
        super().__init__(_Jitter(3))


#: A module-level pipeline, named by a lambda (``transform=lambda x: AUG(x)``).
AUG = _Chain(_Jitter(11), _Jitter(12))


def _deep(depth: int):
    t = _Jitter(5)
    for _ in range(depth):
        t = _Chain(t)
    return t


def _closure():
    rng = random.Random(9)
    return lambda x: x + rng.random()


def _with_parent():
    chain = _Chain(_Jitter(1))
    chain.transforms[0].parent = chain  # refers back to the pipeline holding it
    return chain


DATASETS = {
    "nested 12 deep": lambda: _Applies(_deep(12)),
    "slots, frozen dataclass": lambda: _Applies(_SlottedJitter(np.random.default_rng(4))),
    "module global named by a lambda": lambda: _Applies(lambda x: AUG(x)),  # noqa: PLW0108
    "closure": lambda: _Applies(_closure()),
    "a generator's method": _Draws,
    "class attribute": _ClassLevel,
    "after many records": _RecordsFirst,
    "default of a function": lambda: _Applies(_default_rng),
}


def _default_rng(x: float, rng: random.Random = random.Random(8)) -> float:
    return x + rng.random()


def _batches(cls, ds, **kw):
    return [b.tolist() for b in cls(ds, batch_size=2, num_workers=2, **kw)]


@pytest.mark.parametrize("name", list(DATASETS))
def test_generators_reached_any_way_are_each_workers_own(name):
    # Each was shared by the worker threads: batches unlike DataLoader's and
    # different on every run.
    ds = DATASETS[name]()
    oracle = _batches(DataLoader, ds, multiprocessing_context="fork")
    for _ in range(3):
        assert _batches(ThreadDataLoader, ds) == oracle
    assert _batches(DataLoader, ds, multiprocessing_context="fork") == oracle  # the user's generators untouched


class _Mixup:
    """A collate_fn object with its own generator (a hand-written MixUp collator)."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)

    def __call__(self, batch):
        return default_collate(batch) * float(self.rng.beta(0.4, 0.4))


@pytest.mark.parametrize("worker_processes", [0, 1])
def test_a_collate_fn_with_its_own_generator_is_each_workers_own(worker_processes):
    ds = _Applies(float, n=16)
    oracle = _batches(DataLoader, ds, collate_fn=_Mixup(), multiprocessing_context="fork")
    for _ in range(3):
        assert _batches(ThreadDataLoader, ds, collate_fn=_Mixup(), worker_processes=worker_processes) == oracle


def _reseed(worker_id: int, dataset: _Applies) -> None:
    dataset.transform.rng = np.random.default_rng(100 + worker_id)


def test_a_worker_init_fn_holding_the_dataset_reseeds_the_workers_copy():
    # functools.partial(reseed, dataset=ds): in a worker process the dataset it
    # holds is that process's copy. It reseeded the user's dataset instead
    # (every worker the one object; the worker's copy kept the old seed).
    def run(cls, **kw):
        ds = _Applies(_Jitter(3))
        rng = ds.transform.rng
        out = _batches(cls, ds, worker_init_fn=functools.partial(_reseed, dataset=ds), **kw)
        assert ds.transform.rng is rng  # the user's dataset keeps its generator
        return out

    oracle = run(DataLoader, multiprocessing_context="fork")
    for _ in range(2):
        assert run(ThreadDataLoader) == oracle


def test_hooks_leading_nowhere_are_not_copied_and_the_users_objects_stay_as_they_were():
    ds = _Applies(_Jitter(3))
    ds.files = [f"f{i}" for i in range(1000)]
    init = functools.partial(print, "init")
    parts = worker_parts(ds, init, default_collate)
    assert parts.init_fn is init and parts.collate_fn is default_collate
    assert parts.dataset is not ds and parts.dataset.files is ds.files  # data shared
    assert parts.dataset.transform.rng is not ds.transform.rng


def test_copies_keep_the_shape_of_what_they_copy():
    chain = _with_parent()
    ds = _Applies(chain)
    ds.alias = chain.transforms[0].rng  # one generator under two paths
    own = worker_dataset(ds)
    t = own.transform.transforms[0]
    assert own.transform is not chain and t.parent is own.transform  # the back reference reaches the copy
    assert own.alias is t.rng is not chain.transforms[0].rng
    assert chain.transforms[0].parent is chain  # the user's pipeline unchanged

    lam = worker_dataset(_Applies(lambda x: AUG(x)))  # noqa: PLW0108
    assert lam.transform.__globals__["AUG"] is not AUG and lam.transform.__globals__ is not globals()
    assert lam.transform.__name__ == "<lambda>" and lam.transform(1.0) >= 1.0
    assert globals()["AUG"] is AUG

    slotted = worker_dataset(_Applies(_SlottedJitter(np.random.default_rng(4))))
    assert type(slotted.transform) is _SlottedJitter


def test_a_bound_method_of_the_dataset_as_a_hook_follows_its_copy():
    class Own(_Applies):
        def init(self, worker_id):
            self.worker = worker_id

    ds = Own(_Jitter(3))
    parts = worker_parts(ds, ds.init, None)
    assert parts.init_fn.__self__ is parts.dataset and parts.init_fn.__func__ is Own.init


class _ClosesInDel(Dataset):
    """Opens a file in ``__init__``, and one per worker lazily; closes what it holds in ``__del__``."""

    closed: list[str] = []

    def __init__(self, path) -> None:
        self.path = path
        self.f = open(path, "rb")  # noqa: SIM115 - closed in __del__, the pattern under test
        self.own = None

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        if self.own is None:
            self.own = open(self.path, "rb")  # noqa: SIM115
        self.own.seek(i)
        return self.own.read(1)[0] + 0 * self.f.fileno()

    def __del__(self) -> None:
        for name in ("own", "f"):
            handle = getattr(self, name)
            if handle is not None:
                self.closed.append(name)
                handle.close()


@pytest.mark.parametrize("persistent", [False, True])
def test_a_copy_finalized_closes_its_own_handles_not_the_datasets(tmp_path, persistent):
    # The copies' __del__ closed the file the dataset opened in __init__ (they
    # share it): the next epoch failed, and so did the dataset in the loader's process.
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(range(64)))
    ds = _ClosesInDel(path)
    kw = dict(batch_size=4, num_workers=2, persistent_workers=persistent)
    oracle = [[b.tolist() for b in DataLoader(ds, **kw)] for _ in range(2)]
    _ClosesInDel.closed.clear()
    loader = ThreadDataLoader(ds, **kw)
    assert [[b.tolist() for b in loader] for _ in range(2)] == oracle
    del loader
    gc.collect()
    assert not ds.f.closed and ds[3] == 3  # the dataset's own file stays open
    assert _ClosesInDel.closed == ["own", "own"] * (1 if persistent else 2)  # each copy closed its own, once
    ds.__del__()
    assert ds.f.closed


class _BlocksInGetitem(_ClosesInDel):
    """Index 1 waits for ``gate``: its worker is still in ``__getitem__`` when the loop breaks."""

    gate = threading.Event()
    entered = threading.Event()  # set once index 1's worker is waiting

    def __getitem__(self, i: int) -> int:
        value = super().__getitem__(i)
        if i == 1:
            self.entered.set()
            self.gate.wait(timeout=30)
        return value


def test_a_copy_whose_thread_outlives_the_stop_is_finalized_by_that_thread(tmp_path, monkeypatch):
    # stop() gives up on a thread still in user code after JOIN_BUDGET_S; its
    # copy was then left to the collector, whose __del__ closed the original's file.
    from threadloader.engine import thread_pool as pool_module

    monkeypatch.setattr(pool_module, "JOIN_BUDGET_S", 0.05)
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(range(64)))
    ds = _BlocksInGetitem(path)
    _BlocksInGetitem.gate.clear()
    _BlocksInGetitem.entered.clear()
    _ClosesInDel.closed.clear()
    loader = ThreadDataLoader(ds, batch_size=1, num_workers=2)
    for _ in loader:
        # On a busy machine worker 1 may not have started its task yet:
        # stop() would then find it idle, its copy with no file of its own.
        assert _BlocksInGetitem.entered.wait(timeout=30)
        break  # worker 1 waits in __getitem__(1): stop() leaves it running
    # Worker 0's copy, retired by stop() (or, on a busy machine, by worker 0
    # itself just after the join budget ran out).
    deadline = time.monotonic() + 10
    while _ClosesInDel.closed != ["own"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _ClosesInDel.closed == ["own"]
    _BlocksInGetitem.gate.set()
    assert not wait_no_worker_threads()
    gc.collect()
    assert _ClosesInDel.closed == ["own", "own"]  # worker 1's copy, retired by its thread
    assert not ds.f.closed
    assert [b.tolist() for b in loader] == [[i] for i in range(8)]
    del loader
    ds.__del__()


def test_the_copies_of_a_pool_whose_threads_fail_to_start_are_finalized(tmp_path, monkeypatch):
    # Under a thread limit iter() raises; the copies made for the workers
    # (started or not) must not be left to the collector, whose __del__ would
    # close the original's file.
    real_start = threading.Thread.start

    def start(thread):
        if thread.name == "threadloader-worker-1":
            raise RuntimeError("can't start new thread")
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(range(64)))
    ds = _ClosesInDel(path)
    _ClosesInDel.closed.clear()
    with pytest.raises(RuntimeError, match="can't start new thread"):
        iter(ThreadDataLoader(ds, batch_size=2, num_workers=2))
    assert not wait_no_worker_threads()
    gc.collect()
    assert _ClosesInDel.closed == [] and not ds.f.closed
    ds.__del__()


# --- IterableDatasets: a deep copy per worker, their data shared ---------------------------

class _Progress:
    """Where a shard's iteration stands: mutated in place while iterating (as Hugging Face's examples iterables do)."""

    def __init__(self) -> None:
        self.state = {"shard": 0, "item": 0}


class _StatefulShards(IterableDataset):
    """A Hugging Face ``IterableDataset`` in miniature: shards split over workers, progress kept in a held object,
    ``state_dict()``/``load_state_dict()``, and an epoch in a shared tensor that ``set_epoch`` writes."""

    seen_data: list[bool] = []  # a class's list: every copy appends to this one

    def __init__(self, shards: int = 6, per_shard: int = 5, extra: Any = None) -> None:
        self.shards, self.per_shard = shards, per_shard
        self.progress = _Progress()
        self.epoch = torch.zeros((), dtype=torch.int64).share_memory_()
        self.data = torch.arange(shards * per_shard)  # the data: shared, never copied per worker
        self.extra = extra
        self.start: dict | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch.fill_(epoch)

    def state_dict(self) -> dict:
        return dict(self.progress.state)

    def load_state_dict(self, state: dict) -> None:
        self.start = dict(state)

    def __iter__(self):
        info = get_worker_info()
        wid, n = (info.id, info.num_workers) if info else (0, 1)
        if info is not None:
            self.seen_data.append(info.dataset.data is self.data)
        start = self.start or {"shard": 0, "item": 0}
        order = torch.randperm(self.shards, generator=torch.Generator().manual_seed(int(self.epoch)))
        for shard in order.tolist()[wid::n]:
            for item in range(self.per_shard):
                if (shard, item) < (start["shard"], start["item"]):
                    continue
                self.progress.state.update(shard=shard, item=item + 1)
                yield int(self.data[shard * self.per_shard + item])


def _epochs(cls, dataset, epochs=3, **kwargs):
    loader = cls(dataset, batch_size=2, num_workers=3, **kwargs)
    out = []
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        out.append([b.tolist() for b in loader])
    return out


@pytest.mark.parametrize("worker_processes", [0, 2])
@pytest.mark.parametrize("persistent", [False, True])
def test_an_iterable_datasets_progress_is_each_workers_and_set_epoch_reaches_persistent_workers(
        worker_processes, persistent):
    expected_ds = _StatefulShards()
    expected = _epochs(DataLoader, expected_ds, persistent_workers=persistent)
    ds = _StatefulShards()
    extra = {"worker_processes": worker_processes} if worker_processes else {}
    assert _epochs(ThreadDataLoader, ds, persistent_workers=persistent, **extra) == expected
    # Each worker advanced its own progress, as a worker process does: not the loader's dataset's.
    assert ds.state_dict() == expected_ds.state_dict() == {"shard": 0, "item": 0}


def test_an_iterable_datasets_tensors_are_shared_with_the_workers_copies():
    _StatefulShards.seen_data.clear()
    assert sum(len(e) for e in _epochs(ThreadDataLoader, _StatefulShards(), epochs=1)) == 15
    assert _StatefulShards.seen_data == [True, True, True]


def test_what_deepcopy_cannot_copy_in_an_iterable_dataset_is_shared_and_the_rest_is_each_workers(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x")
    expected_ds = _StatefulShards()
    expected = _epochs(DataLoader, expected_ds)
    with open(path, "rb") as handle:
        ds = _StatefulShards(extra=[threading.Lock(), handle, (i for i in range(3))])  # no deepcopy for these
        copy = worker_dataset(ds)
        assert all(a is b for a, b in zip(copy.extra, ds.extra)) and copy.extra is not ds.extra
        assert copy.progress is not ds.progress
        assert _epochs(ThreadDataLoader, ds) == expected
        assert ds.state_dict() == expected_ds.state_dict()


class _RebuildFails:
    """Reduces, but cannot be rebuilt: deepcopy fails half-way."""

    def __reduce__(self):
        return (_refuse, ())


def _refuse():
    raise RuntimeError("cannot be rebuilt")


def test_an_iterable_dataset_deepcopy_fails_on_gets_the_shallow_copy():
    ds = _StatefulShards(extra=_RebuildFails())
    copy = worker_dataset(ds)
    assert copy is not ds and copy.progress is ds.progress and copy.extra is ds.extra  # shallow, as before
    assert sum(len(e) for e in _epochs(ThreadDataLoader, ds, epochs=1)) == 15


@pytest.mark.parametrize("worker_processes", [0, 2])
def test_an_iterable_dataset_with_its_own_state_dict_resumes_after_a_break(worker_processes):
    extra = {"worker_processes": worker_processes} if worker_processes else {}

    def make():
        return ThreadDataLoader(_StatefulShards(), batch_size=2, num_workers=3, **extra)

    full = [b.tolist() for b in make()]
    loader = make()
    assert [b.tolist() for b in loader] == full  # an epoch first: the next one starts from what it left
    it = iter(loader)
    head = [next(it).tolist() for _ in range(4)]
    state = loader.state_dict()
    del it
    resumed = make()
    resumed.load_state_dict(state)
    assert head + [b.tolist() for b in resumed] == full


class _EpochCountingStage:
    """webdataset's ``detshuffle`` in miniature: a pipeline stage that counts its epochs itself."""

    def __init__(self, seed: int) -> None:
        self.seed, self.epoch = seed, -1

    def __call__(self, items: list[int]) -> list[int]:
        self.epoch += 1
        order = list(items)
        random.Random(self.seed + self.epoch).shuffle(order)
        return order


class _Pipeline(IterableDataset):
    """Shards (a short list: part of the pipeline) through stages, split over workers; a long list of data."""

    def __init__(self) -> None:
        self.shards = list(range(8))
        self.stages = [_EpochCountingStage(seed=3)]
        self.labels = [f"label-{i}" for i in range(1000)]  # data: more than _MAX_ITEMS items

    def __iter__(self):
        info = get_worker_info()
        wid, n = (info.id, info.num_workers) if info else (0, 1)
        shards = self.shards
        for stage in self.stages:
            shards = stage(shards)
        for shard in shards[wid::n]:
            yield shard, self.labels[shard], id(self.labels)


@pytest.mark.parametrize("worker_processes", [0, 3])
@pytest.mark.parametrize("persistent", [False, True])
def test_state_deep_in_an_iterable_pipeline_is_each_workers(worker_processes, persistent):
    # Every worker thread advanced the one shared stage: each epoch shuffled with another seed than DataLoader's.
    def epochs(cls, **extra):
        loader = cls(_Pipeline(), batch_size=None, num_workers=3, persistent_workers=persistent, **extra)
        return [[(shard, label) for shard, label, _ in loader] for _ in range(3)]

    extra = {"worker_processes": worker_processes} if worker_processes else {}
    assert epochs(ThreadDataLoader, **extra) == epochs(DataLoader)


def test_an_iterable_datasets_long_containers_are_data_shared_with_the_workers_copies():
    ds = _Pipeline()
    copy = worker_dataset(ds)
    assert copy.labels is ds.labels  # data: one list, whatever the number of workers
    assert copy.stages is not ds.stages and copy.stages[0] is not ds.stages[0]  # the pipeline: the worker's
    assert copy.shards is not ds.shards
    assert {ident for _, _, ident in ThreadDataLoader(ds, batch_size=None, num_workers=2)} == {id(ds.labels)}


class _Shuffles:
    """A transform with its own generator, reseeded per worker by a hook that holds it."""

    def __init__(self) -> None:
        self.rng = random.Random(0)

    def __call__(self, x: int) -> float:
        return x + self.rng.random()


class _Transformed(IterableDataset):
    def __init__(self) -> None:
        self.transform = _Shuffles()
        self.step = _EpochCountingStage(seed=1)

    def __iter__(self):
        info = get_worker_info()
        for i in self.step(list(range(6)))[info.id::info.num_workers]:
            yield self.transform(i)


def _reseed_transform(worker_id: int, transform: _Shuffles) -> None:
    transform.rng.seed(worker_id + 100)


def test_a_hook_holding_part_of_an_iterable_dataset_gets_that_part_of_the_workers_deep_copy():
    def epochs(cls, **extra):
        ds = _Transformed()
        loader = cls(ds, batch_size=None, num_workers=2, worker_init_fn=functools.partial(_reseed_transform, transform=ds.transform),
                     **extra)
        return [list(loader) for _ in range(2)]

    expected = epochs(DataLoader)
    assert epochs(ThreadDataLoader) == expected
    assert epochs(ThreadDataLoader, worker_processes=2) == expected
