"""ThreadDataLoader's contract, bullet by bullet, against DataLoader."""

from __future__ import annotations

import functools
import gc
import inspect
import itertools
import multiprocessing
import random
import re
import threading
import time
import warnings

import numpy as np
import pytest
import torch
from conftest import wait_no_worker_threads, worker_threads
from helpers import (
    DictProxy,
    DiesAt,
    Failing,
    OwnGenerators,
    Recorder,
    Sharded,
    Slow,
    Squares,
    to_list,
    worker_torch_generator,
)
from torch.utils.data import (
    ConcatDataset,
    DataLoader,
    Dataset,
    IterableDataset,
    Subset,
    get_worker_info,
)

import threadloader
from threadloader import ThreadDataLoader
from threadloader.state import STATE_VERSION

# --- the constructor is DataLoader's ------------------------------------------------

def test_signature_is_dataloaders():
    ours = inspect.signature(ThreadDataLoader.__init__).parameters
    theirs = inspect.signature(DataLoader.__init__).parameters
    # DataLoader's parameters, then our one keyword-only addition.
    assert list(ours) == [*theirs, "worker_processes"]
    assert ours["worker_processes"].kind == inspect.Parameter.KEYWORD_ONLY
    assert ours["worker_processes"].default is None
    for name in theirs:
        assert ours[name].kind == theirs[name].kind, name
        assert ours[name].default == theirs[name].default, name


INVALID = [
    (dict(num_workers=-1), {}),
    (dict(timeout=-1), {}),
    (dict(prefetch_factor=2), {}),
    (dict(num_workers=2, prefetch_factor=-1), {}),
    (dict(persistent_workers=True), {}),
    (dict(sampler=[0, 1], shuffle=True), {}),
    (dict(batch_sampler=[[0]], batch_size=2), {}),
    (dict(batch_sampler=[[0]], drop_last=True), {}),
    (dict(batch_size=None, drop_last=True), {}),
    (dict(num_workers=2, multiprocessing_context="nope"), {}),
    (dict(num_workers=2, multiprocessing_context=3), {}),
    (dict(multiprocessing_context="fork"), {}),
    (dict(shuffle=True), {"iterable": True}),
    (dict(sampler=[0]), {"iterable": True}),
    (dict(batch_sampler=[[0]]), {"iterable": True}),
]


@pytest.mark.parametrize("kwargs,opts", INVALID)
def test_invalid_arguments_raise_like_dataloader(kwargs, opts):
    dataset = Sharded(0, 4) if opts.get("iterable") else Squares(4)
    with pytest.raises(Exception) as theirs:
        DataLoader(dataset, **kwargs)
    with pytest.raises(Exception) as ours:
        ThreadDataLoader(dataset, **kwargs)
    assert type(ours.value) is type(theirs.value)
    assert str(ours.value) == str(theirs.value).replace("DataLoader", "ThreadDataLoader") or str(ours.value) == str(
        theirs.value
    )


def test_len_isinstance_and_frozen_attributes():
    loader = ThreadDataLoader(Squares(10), batch_size=3, num_workers=2)
    assert isinstance(loader, DataLoader)
    assert len(loader) == len(DataLoader(Squares(10), batch_size=3)) == 4
    assert len(ThreadDataLoader(Squares(10), batch_size=3, drop_last=True)) == 3
    for attr in ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers"):
        with pytest.raises(ValueError, match=f"{attr} attribute should not be set after ThreadDataLoader is initialized"):
            setattr(loader, attr, None)
    loader.num_workers = 1  # not frozen in DataLoader either
    assert to_list(loader) == to_list(DataLoader(Squares(10), batch_size=3))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_subclass_may_wrap_the_iterator(num_workers):
    # Any iterator will do for DataLoader's __iter__, one without weak references included.
    def limited(base):
        class Limited(base):
            def _get_iterator(self):
                return itertools.islice(super()._get_iterator(), 2)
        return Limited

    loaders = [limited(cls)(Squares(10), batch_size=2, num_workers=num_workers)
               for cls in (DataLoader, ThreadDataLoader)]
    assert to_list(loaders[1]) == to_list(loaders[0])
    it = iter(loaders[1])
    next(it)
    assert loaders[1].state_dict()["epoch"]["consumed_prefix"] == 1  # follows the iterator it built
    del it


def test_multiprocessing_context_is_validated_then_ignored():
    loader = ThreadDataLoader(Squares(6), batch_size=2, num_workers=2, multiprocessing_context="spawn")
    assert isinstance(loader.multiprocessing_context, multiprocessing.context.BaseContext)
    before = multiprocessing.active_children()
    assert to_list(loader) == to_list(DataLoader(Squares(6), batch_size=2))
    assert multiprocessing.active_children() == before


# --- threads, batching, order ---------------------------------------------------------

def test_runs_on_num_workers_threads():
    ds = Recorder(40)
    list(ThreadDataLoader(ds, batch_size=4, num_workers=3))
    idents = {ident for _, ident, _ in ds.seen.values()}
    assert 1 <= len(idents) <= 3
    assert threading.get_ident() not in idents
    assert {info.id for info, _, _ in ds.seen.values()} <= {0, 1, 2}


def test_getitems_is_called_once_per_batch():
    class Batched(Squares):
        def __init__(self, n):
            super().__init__(n)
            self.calls = []
            self.lock = threading.Lock()

        def __getitems__(self, indices):
            with self.lock:
                self.calls.append(list(indices))
            return [self[i] for i in indices]

    ds = Batched(10)
    got = to_list(ThreadDataLoader(ds, batch_size=4, num_workers=2))
    assert got == to_list(DataLoader(Squares(10), batch_size=4))
    assert sorted(ds.calls) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


class _IndexTypes(Dataset):
    """``__getitems__`` returns what it was given: its type and values."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i):
        return i

    def __getitems__(self, idx):
        return [(type(idx).__name__, [int(i) for i in idx])]


class _VariedBatches(torch.utils.data.Sampler):
    def __len__(self) -> int:
        return 4

    def __iter__(self):
        yield np.arange(0, 2)
        yield torch.arange(2, 4)
        yield range(4, 6)
        # An iterator is read on the consumer thread (it may be a lazy view of
        # the sampler's own iterator), as DataLoader reads it when pickling it.
        yield iter([6, 7])


def test_getitems_gets_what_the_batch_sampler_yielded_as_dataloader():
    def run(cls, **kw):
        loader = cls(_IndexTypes(), batch_sampler=_VariedBatches(), num_workers=2, collate_fn=lambda b: b, **kw)
        return list(loader)

    got = run(ThreadDataLoader)
    assert got[:3] == run(DataLoader, multiprocessing_context="fork")[:3]
    assert [kind for ((kind, _),) in got] == ["ndarray", "Tensor", "range", "list"]


class _WhoFetched(Dataset):
    """Each sample says which worker fetched it (picklable for worker processes)."""

    def __len__(self):
        return 23

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        return i, (-1 if info is None else info.id)


@pytest.mark.parametrize("batch_size", [None, 1, 4])
def test_tasks_go_to_workers_as_in_dataloader(batch_size):
    # Task i is served whole by worker i mod num_workers, as by DataLoader's
    # worker processes: per-worker randomness then follows the same stream.
    kwargs = dict(batch_size=batch_size, num_workers=3, shuffle=True, generator=torch.Generator().manual_seed(5))
    ours = to_list(ThreadDataLoader(_WhoFetched(), **kwargs))
    kwargs["generator"] = torch.Generator().manual_seed(5)
    theirs = to_list(DataLoader(_WhoFetched(), **kwargs))
    assert ours == theirs


def test_custom_collate_and_batch_sampler_iterable():
    batches = [[3, 1], [0], [2, 2, 2]]
    got = list(ThreadDataLoader(Squares(4), batch_sampler=batches, num_workers=2, collate_fn=lambda b: [x[0] for x in b]))
    assert got == [[3, 1], [0], [2, 2, 2]]


def test_in_flight_bounded_by_prefetch_factor_times_workers():
    drawn = []

    class CountingSampler:
        def __iter__(self):
            for i in range(200):
                drawn.append(i)
                yield i

        def __len__(self):
            return 200

    loader = ThreadDataLoader(Squares(200), batch_size=None, sampler=CountingSampler(), num_workers=3,
                              prefetch_factor=2)
    for consumed, _ in enumerate(loader, start=1):
        time.sleep(0.0005)
        assert len(drawn) - consumed <= 2 * 3 + 1


def test_in_order_false_releases_ready_batches_first():
    ds = Slow(8, 0.5, slow={0})
    got = list(ThreadDataLoader(ds, batch_size=None, num_workers=2, in_order=False))
    assert sorted(got) == list(range(8))
    assert got[0] != 0


def test_default_collate_does_not_use_shared_memory():
    batch = next(iter(ThreadDataLoader(Squares(8), batch_size=4, num_workers=2)))
    assert not batch[1].is_shared()
    # ...whereas DataLoader's worker processes do put it there.
    batch = next(iter(DataLoader(Squares(8), batch_size=4, num_workers=1, multiprocessing_context="fork")))
    assert batch[1].is_shared()


# --- worker info and randomness -----------------------------------------------------------

@pytest.mark.parametrize("wrap", ["Subset", "ConcatDataset"])
def test_generators_of_a_wrapped_dataset_are_each_workers_own(wrap):
    # random_split gives a Subset: the generators are the inner dataset's.
    inner = OwnGenerators()
    ds = Subset(inner, range(16)) if wrap == "Subset" else ConcatDataset([inner, inner])
    oracle = [to_list(b) for b in DataLoader(ds, batch_size=2, num_workers=2)]
    for _ in range(2):
        assert [to_list(b) for b in ThreadDataLoader(ds, batch_size=2, num_workers=2)] == oracle


class _RandFlip:
    """A transform holding its own generator (MONAI's ``Randomizable``: ``self.R``)."""

    def __init__(self):
        self.R = np.random.RandomState()

    def set_random_state(self, seed):
        self.R = np.random.RandomState(seed)

    def __call__(self, x):
        return -x if self.R.rand() < 0.5 else x


class _AddNoise(_RandFlip):
    def __call__(self, x):
        return x + float(self.R.normal())


class _Compose:
    def __init__(self, transforms):
        self.transforms = list(transforms)
        self.torch_rng = torch.Generator().manual_seed(11)  # a pipeline-level generator too

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x + torch.rand((), generator=self.torch_rng).item()


class _Pipelined(Dataset):
    """Random transforms inside a pipeline inside the dataset, with data that must stay shared."""

    def __init__(self, n=24):
        flip = _RandFlip()
        self.data = np.arange(n, dtype=np.float64)
        self.files = [f"f{i}" for i in range(200)]  # a long list: data, not searched
        self.transform = _Compose([flip, _AddNoise(), flip])  # one transform twice
        self.extra = {"aug": (flip,)}  # reached again by another path
        self.noise = _AddNoise().__call__  # a method of an object holding a generator

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        time.sleep(0.001 * (i % 3))  # workers interleave differently on every run
        t = self.transform
        assert t.transforms[0] is t.transforms[2] is self.extra["aug"][0]  # one object, as in a process
        return self.noise(t(self.data[i]))


def _reseed_transforms(worker_id):
    # MONAI's worker_init_fn pattern: reseed the worker's dataset's transforms.
    info = torch.utils.data.get_worker_info()
    for k, t in enumerate(info.dataset.transform.transforms):
        t.set_random_state(info.seed % (2**32) + k)


@pytest.mark.parametrize("init_fn", [None, _reseed_transforms])
@pytest.mark.parametrize("num_workers,worker_processes,persistent", [(2, 0, False), (4, 0, True), (4, 2, False)])
def test_generators_inside_a_datasets_transforms_are_each_workers_own(init_fn, num_workers, worker_processes, persistent):
    # They were shared by the threads (a shallow copy): the draws went in the
    # order the threads ran, and a worker_init_fn reseeding them reseeded one
    # shared object (the last worker's seed won). MONAI's random transforms.
    ds = _Pipelined()
    before = ds.transform.transforms[1].R.get_state()[1].copy()
    kwargs = dict(batch_size=3, num_workers=num_workers, worker_init_fn=init_fn, persistent_workers=persistent,
                  shuffle=True)

    def epochs(cls, **extra):
        loader = cls(ds, **kwargs, **extra, generator=torch.Generator().manual_seed(5))
        return [[b.tolist() for b in loader] for _ in range(2)]

    oracle = epochs(DataLoader, multiprocessing_context="fork")
    for _ in range(2):
        assert epochs(ThreadDataLoader, worker_processes=worker_processes) == oracle
    assert (ds.transform.transforms[1].R.get_state()[1] == before).all()  # the loader's dataset keeps its own


def test_a_workers_dataset_copies_only_what_leads_to_a_generator():
    from threadloader.worker.copies import worker_dataset

    ds = _Pipelined()
    ds.plain = {"a": [1, 2, 3]}
    copy_ = worker_dataset(ds)
    assert copy_.data is ds.data and copy_.files is ds.files and copy_.plain is ds.plain  # shared data
    assert copy_.transform is not ds.transform and copy_.transform.transforms is not ds.transform.transforms
    assert copy_.transform.transforms[0].R is not ds.transform.transforms[0].R
    assert copy_.transform.transforms[0] is copy_.extra["aug"][0]  # one object under two paths stays one
    assert copy_.transform.torch_rng is not ds.transform.torch_rng
    assert copy_.noise.__self__.R is not ds.noise.__self__.R


class _AugmentsWithItsOwnMethod(Dataset):
    """``self.transform = self.augment``: the transform refers back to the dataset and its generator."""

    def __init__(self):
        self.rng = np.random.default_rng(0)
        self.transform = self.augment

    def augment(self, x):
        return x + float(self.rng.random())

    def __len__(self):
        return 12

    def __getitem__(self, i):
        time.sleep(0.001 * (i % 3))
        return self.transform(float(i))


def test_a_transform_bound_to_the_dataset_draws_from_the_workers_copy():
    ds = _AugmentsWithItsOwnMethod()
    oracle = [b.tolist() for b in DataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="fork")]
    for _ in range(2):
        assert [b.tolist() for b in ThreadDataLoader(ds, batch_size=2, num_workers=2)] == oracle
    assert ds.rng.random() == np.random.default_rng(0).random()


class _SlottedConfig:
    """``__slots__`` and a ``__getattr__`` that raises KeyError for unknown names (``vars()`` asks for ``__dict__``)."""

    __slots__ = ("d",)

    def __init__(self):
        self.d = {"scale": 2}

    def __getattr__(self, name):
        return self.d[name]


class _SharesItsNamespace:
    """A ``__copy__`` that hands back an object sharing the original's ``__dict__``."""

    def __init__(self):
        self.rng = random.Random(4)

    def __copy__(self):
        other = object.__new__(type(self))
        object.__setattr__(other, "__dict__", self.__dict__)
        return other


class _OddHolders(Dataset):
    def __init__(self):
        self.config = _SlottedConfig()
        self.shared = _SharesItsNamespace()

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return i * self.config.scale


def test_objects_that_resist_the_search_are_shared_not_fatal():
    # vars() of the config raised KeyError through its __getattr__ and killed iter();
    # the namespace-sharing copy would have had its generator replaced in the user's object.
    ds = _OddHolders()
    rng = ds.shared.rng
    oracle = [b.tolist() for b in DataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="fork")]
    assert [b.tolist() for b in ThreadDataLoader(ds, batch_size=2, num_workers=2)] == oracle
    assert ds.shared.rng is rng


def test_generators_in_namedtuples_ordered_dicts_and_partials_are_each_workers_own():
    import collections

    from threadloader.worker.copies import worker_dataset

    Pair = collections.namedtuple("Pair", "rng label")

    class Holder(Dataset):
        def __init__(self):
            self.pair = Pair(random.Random(1), "a")
            self.ordered = collections.OrderedDict(rng=np.random.default_rng(2))
            self.defaults = collections.defaultdict(list, rng=torch.Generator().manual_seed(3))
            self.partial = functools.partial(random.Random.random, random.Random(5))

    ds = Holder()
    copy_ = worker_dataset(ds)
    assert type(copy_.pair) is Pair and copy_.pair.rng is not ds.pair.rng and copy_.pair.label == "a"
    assert type(copy_.ordered) is collections.OrderedDict and copy_.ordered["rng"] is not ds.ordered["rng"]
    assert copy_.defaults.default_factory is list and copy_.defaults["rng"] is not ds.defaults["rng"]
    assert copy_.partial.args[0] is not ds.partial.args[0] and copy_.partial() == ds.partial()


class _Seeded(random.Random):
    """A generator subclass whose constructor needs arguments (deepcopy cannot rebuild it)."""

    def __new__(cls, *args):  # (Python 3.10's Random.__new__ refuses two arguments; __init__ seeds)
        return super().__new__(cls)

    def __init__(self, seed, name):
        super().__init__(seed)
        self.name = name


class _OddGenerators(Dataset):
    def __init__(self):
        self.seeded = _Seeded(5, "aug")
        self.alias = self.seeded  # one generator under two names
        self.system = random.SystemRandom()  # no state to copy

    def __len__(self):
        return 8

    def __getitem__(self, i):
        time.sleep(0.001 * (i % 3))
        assert self.alias is self.seeded and self.seeded.name == "aug"
        self.system.random()
        return i, self.seeded.random()


def test_generators_that_deepcopy_cannot_copy_neither_kill_the_workers_nor_split():
    ds = _OddGenerators()
    oracle = [to_list(b) for b in DataLoader(ds, batch_size=2, num_workers=2)]
    assert [to_list(b) for b in ThreadDataLoader(ds, batch_size=2, num_workers=2)] == oracle


def test_a_dataset_whose_copy_is_itself_keeps_its_generators():
    class CopiesToItself(OwnGenerators):
        def __copy__(self):
            return self

    ds = CopiesToItself()
    rng = ds.np_rng
    assert len(list(ThreadDataLoader(ds, batch_size=2, num_workers=2))) == 8
    assert ds.np_rng is rng  # the user's object: nothing written into it

def test_each_worker_has_its_own_shallow_copy_of_the_dataset():
    # As with worker processes: attributes a worker sets stay its own (the
    # lazily opened handle pattern), the data the dataset holds is not copied.
    class LazyHandle(Dataset):
        def __init__(self):
            self.data = list(range(24))
            self.handle = None

        def __len__(self):
            return len(self.data)

        def __getitem__(self, i):
            if self.handle is None:
                self.handle = torch.utils.data.get_worker_info().id  # "open" once per worker
            return self.handle, id(self.data), self.data[i]

    def init(worker_id):
        torch.utils.data.get_worker_info().dataset.init_id = worker_id

    ds = LazyHandle()
    kw = dict(batch_size=None, num_workers=3, worker_init_fn=init, persistent_workers=True)
    loader, oracle = ThreadDataLoader(ds, **kw), DataLoader(ds, **kw)
    for _ in range(2):  # persistent workers keep their copy across epochs
        ours, theirs = list(loader), list(oracle)
        assert [(o[0], o[2]) for o in ours] == [(t[0], t[2]) for t in theirs]
        assert [o[0] for o in ours] == [i % 3 for i in range(24)]
        assert {o[1] for o in ours} == {id(ds.data)}  # the data itself is shared
    assert ds.handle is None and not hasattr(ds, "init_id")  # the loader's own object is untouched

    class InitOnSelf(Squares):  # torch's TestWorkerQueueDataset pattern
        def init(self, worker_id):
            self.worker_id = worker_id

        def __getitem__(self, i):
            return self.worker_id, super().__getitem__(i)

        def collate(self, batch):
            return [self.worker_id] + [b[0] for b in batch]

    init_ds = InitOnSelf(12)
    got = to_list(ThreadDataLoader(init_ds, batch_size=2, num_workers=3, worker_init_fn=init_ds.init,
                                   collate_fn=init_ds.collate))
    assert got == to_list(DataLoader(init_ds, batch_size=2, num_workers=3, worker_init_fn=init_ds.init,
                                     collate_fn=init_ds.collate))
    assert [b[0] for b in got] == [i % 3 for i in range(6)] and not hasattr(init_ds, "worker_id")

    class Uncopyable(Squares):
        def __reduce_ex__(self, protocol):
            raise TypeError("no copies")

    assert to_list(ThreadDataLoader(Uncopyable(6), num_workers=2)) == to_list(DataLoader(Squares(6), num_workers=0))


def test_worker_info_is_thread_local():
    ds = Recorder(60)
    torch.manual_seed(5)
    list(ThreadDataLoader(ds, batch_size=2, num_workers=3))
    torch.manual_seed(5)
    base_seed = torch.empty((), dtype=torch.int64).random_().item()
    for info, ident, gen in ds.seen.values():
        assert info.num_workers == 3 and 0 <= info.id < 3
        assert info.seed == base_seed + info.id
        # the worker's own shallow copy, as a worker process has its own copy
        assert type(info.dataset) is Recorder and info.dataset is not ds
        assert info.dataset.seen is ds.seen
        assert info.worker_method == "thread"
        assert gen is info.rng.torch_generator
    per_thread = {}
    for info, ident, _ in ds.seen.values():
        per_thread.setdefault(ident, set()).add(info.id)
    assert all(len(ids) == 1 for ids in per_thread.values())
    assert torch.utils.data.get_worker_info() is None
    assert threadloader.get_worker_info is torch.utils.data.get_worker_info
    assert worker_torch_generator() is None


def test_worker_init_fn_called_once_per_worker_with_info():
    calls = []
    lock = threading.Lock()

    def init(worker_id):
        info = torch.utils.data.get_worker_info()
        with lock:
            calls.append((worker_id, info.id, info.num_workers, threading.get_ident()))

    list(ThreadDataLoader(Squares(20), batch_size=2, num_workers=3, worker_init_fn=init))
    assert sorted(c[0] for c in calls) == [0, 1, 2]
    assert all(c[0] == c[1] and c[2] == 3 for c in calls)
    assert len({c[3] for c in calls}) == 3


def test_per_thread_generators_are_seeded_like_workers_and_globals_untouched():
    class Draws(Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            info = torch.utils.data.get_worker_info()
            return info.id, torch.randint(0, 2**30, (1,), generator=worker_torch_generator()).item()

    torch.manual_seed(0)
    py_state, np_state = random.getstate(), np.random.get_state()
    out = list(ThreadDataLoader(Draws(), batch_size=None, num_workers=2))
    assert random.getstate() == py_state
    assert np.array_equal(np.random.get_state()[1], np_state[1])
    torch.manual_seed(0)
    base_seed = torch.empty((), dtype=torch.int64).random_().item()
    first = {}
    for wid, value in out:
        first.setdefault(wid, value)
    for wid, value in first.items():
        g = torch.Generator()
        g.manual_seed(base_seed + wid)
        assert value == torch.randint(0, 2**30, (1,), generator=g).item()


def test_iterable_dataset_length_warning_like_dataloader():
    class Liar(IterableDataset):
        def __len__(self):
            return 2

        def __iter__(self):
            return iter(range(5))

    loader = ThreadDataLoader(Liar(), num_workers=1)
    assert len(loader) == 2
    with pytest.warns(UserWarning, match=r"was reported to be 2\(when accessing len\(dataloader\)\), but 3 samples"):
        list(loader)


def test_pin_memory_without_accelerator_warns_like_dataloader():
    if torch.accelerator.is_available():
        pytest.skip("an accelerator exists")
    with pytest.warns(UserWarning, match="'pin_memory' argument is set as true but no accelerator is found"):
        batch = next(iter(ThreadDataLoader(Squares(4), batch_size=2, num_workers=1, pin_memory=True)))
    assert not batch[1].is_pinned()

    # Same text, category, file and line as DataLoader's worker iterator: a
    # filter on torch's dataloader module silences both.
    def warned(cls, **kw):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            it = iter(cls(Squares(4), batch_size=2, num_workers=1, pin_memory=True, **kw))
            del it
        # (fork may add Python's own DeprecationWarning about forking threads)
        return [(w.category, str(w.message), w.filename, w.lineno) for w in caught if "pin" in str(w.message)]

    assert warned(ThreadDataLoader) == warned(DataLoader, multiprocessing_context="fork")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pin_memory_pins_batches():
    for batch in ThreadDataLoader(Squares(8), batch_size=4, num_workers=2, pin_memory=True):
        assert batch[1].is_pinned()


def test_persistent_workers_keep_threads_and_match_dataloader():
    ds = Recorder(12)
    loader = ThreadDataLoader(ds, batch_size=3, num_workers=2, persistent_workers=True, shuffle=True,
                              generator=torch.Generator().manual_seed(3))
    threads = {}
    for epoch in range(3):
        it = iter(loader)
        next(it)
        if epoch == 1:
            del it  # an epoch abandoned early...
        else:
            list(it)  # ...and full ones
        for info, ident, _ in ds.seen.values():
            assert threads.setdefault(info.id, ident) == ident  # the same thread serves each worker id
    oracle = DataLoader(Squares(12), batch_size=3, num_workers=2, persistent_workers=True, shuffle=True,
                        generator=torch.Generator().manual_seed(3), multiprocessing_context="fork")
    ours = ThreadDataLoader(Squares(12), batch_size=3, num_workers=2, persistent_workers=True, shuffle=True,
                            generator=torch.Generator().manual_seed(3))
    assert [to_list(ours) for _ in range(3)] == [to_list(oracle) for _ in range(3)]
    del loader, ours
    gc.collect()


# --- errors -------------------------------------------------------------------------------

def test_exception_sequence_matches_dataloader():
    def outcomes(loader):
        out, it = [], iter(loader)
        while True:
            try:
                out.append(next(it).tolist())
            except StopIteration:
                return out
            except KeyError as exc:
                out.append(("KeyError", "bad sample" in str(exc)))

    ds = Failing(9, {1, 5}, exc=KeyError)
    assert outcomes(ThreadDataLoader(ds, batch_size=2, num_workers=3)) == outcomes(
        DataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="fork"))


def test_exception_that_cannot_be_rebuilt_becomes_runtime_error():
    class Odd(Exception):
        def __init__(self, a, b):
            super().__init__(a, b)

    class DS(Squares):
        def __getitem__(self, i):
            raise Odd(1, 2)

    with pytest.raises(RuntimeError, match="Caught Odd in DataLoader worker thread"):
        next(iter(ThreadDataLoader(DS(2), num_workers=1)))


def test_collate_exception_reaches_user():
    def bad_collate(batch):
        raise TypeError("cannot collate this")

    with pytest.raises(TypeError, match="(?s)collate_fn.*cannot collate this"):
        next(iter(ThreadDataLoader(Squares(4), batch_size=2, num_workers=2, collate_fn=bad_collate)))


def test_iterable_dataset_iter_exception_reaches_user():
    class Broken(IterableDataset):
        def __iter__(self):
            raise OSError("shard missing")

    with pytest.raises(OSError, match="shard missing"):
        next(iter(ThreadDataLoader(Broken(), num_workers=2)))


class _ProxySampler(DictProxy, torch.utils.data.Sampler):
    def __init__(self):
        self.cfg = {"n": 6}

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n


class _ProxyIterable(DictProxy, IterableDataset):
    def __init__(self):
        self.cfg = {"n": 4}

    def __iter__(self):
        info = get_worker_info()
        return iter(range(0 if info is None else info.id, self.n, 1 if info is None else info.num_workers))


class _ProxyCollate(DictProxy):
    def __init__(self):
        self.cfg = {}

    def __call__(self, batch):
        return torch.utils.data.default_collate(batch)


class _ProxyInit(_ProxyCollate):
    def __call__(self, worker_id):
        pass


@pytest.mark.parametrize("num_workers", [0, 2])
def test_objects_whose_getattr_raises_other_errors_work_as_in_dataloader(num_workers):
    # DataLoader never asks these objects for optional attributes; we ask for
    # epoch/state_dict/generator (resume) and __self__ (rebinding): a proxy's
    # KeyError for names it does not know must not escape.
    cases = [dict(dataset=list(range(6)), sampler=_ProxySampler(), batch_size=2),
             dict(dataset=_ProxyIterable(), batch_size=2),
             dict(dataset=list(range(4)), batch_size=2, collate_fn=_ProxyCollate()),
             dict(dataset=list(range(4)), batch_size=2, worker_init_fn=_ProxyInit() if num_workers else None)]
    for kw in cases:
        got = sorted(to_list(ThreadDataLoader(num_workers=num_workers, **kw)))
        assert got == sorted(to_list(DataLoader(num_workers=num_workers, **kw))), kw
    assert ThreadDataLoader(list(range(6)), sampler=_ProxySampler(), batch_size=2).state_dict()["version"] == STATE_VERSION


def test_sampler_exception_reaches_user():
    class BadSampler:
        def __iter__(self):
            yield 0
            raise LookupError("sampler broke")

        def __len__(self):
            return 3

    with pytest.raises(LookupError, match="sampler broke"):
        list(ThreadDataLoader(Squares(3), sampler=BadSampler(), num_workers=2))


def test_worker_thread_dying_is_reported_not_hung():
    class Exits(Squares):
        def __getitem__(self, i):
            raise SystemExit(3)

    with pytest.raises(RuntimeError, match=r"DataLoader worker \(thread \d\) exited unexpectedly"):
        list(ThreadDataLoader(Exits(4), num_workers=1, timeout=10))


class _NeedsArgument(SystemExit):
    def __init__(self, code, detail):  # pickles, but cannot be rebuilt from its args
        super().__init__(code)


@pytest.mark.parametrize("exc", [SystemExit(threading.Lock()), _NeedsArgument(3, "x")], ids=["unpicklable", "no_unpickle"])
def test_a_worker_ended_by_an_exception_that_cannot_cross_processes_still_dies_as_dataloaders(exc):
    # Its death must still reach the consumer (else next() waits for the dead
    # worker's task for ever), named by the exception's repr.
    loader = ThreadDataLoader(DiesAt(exc), batch_size=None, num_workers=2, timeout=20, worker_processes=1)
    with pytest.raises(RuntimeError) as info:
        list(loader)
    assert re.match(r"^DataLoader worker \(thread 0\) exited unexpectedly: ", str(info.value))
    assert repr(exc) in str(info.value)


@pytest.mark.parametrize("cls", [DataLoader, ThreadDataLoader])
def test_timeout_bounds_the_wait_for_an_abandoned_epoch_as_in_dataloader(cls):
    # The next epoch waits for the tasks queued before the break; a worker
    # stuck in one of them times out there, as DataLoader's does.
    loader = cls(Slow(8, 3.0, slow={3}), batch_size=None, num_workers=2, timeout=0.5, persistent_workers=True)
    for _ in loader:
        break
    with pytest.raises(RuntimeError, match=r"^DataLoader timed out after 0.5 seconds$"):
        iter(loader)


class _Delays(Dataset):
    def __init__(self, delays: dict[int, float], n: int) -> None:
        self.delays, self.n = delays, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        time.sleep(self.delays.get(i, 0.0))
        return i


def test_timeout_bounds_each_wait_not_the_wait_for_a_batch_in_order():
    # As DataLoader: task 1 arrives first (1.2 s, kept for later), then task 0
    # 1.8 s after it; neither wait reaches 2.2 s, their sum does.
    loader = ThreadDataLoader(_Delays({0: 3.0, 1: 1.2}, 4), batch_size=None, num_workers=2, timeout=2.2)
    assert list(loader) == [0, 1, 2, 3]


def test_timeout_does_not_fire_when_data_arrives():
    assert list(ThreadDataLoader(Slow(3, 0.01), batch_size=None, num_workers=2, timeout=5)) == [0, 1, 2]


def test_threads_stop_when_a_worker_is_stuck_in_user_code():
    loader = ThreadDataLoader(Slow(4, 1.0), batch_size=None, num_workers=2)
    it = iter(loader)
    t0 = time.monotonic()
    del it
    gc.collect()
    assert time.monotonic() - t0 < 1.5  # shutdown does not wait out the stuck call
    assert wait_no_worker_threads(3.0) == []


def test_persistent_workers_stop_with_the_loader():
    loader = ThreadDataLoader(Squares(10), batch_size=2, num_workers=2, persistent_workers=True)
    list(loader)
    assert len(worker_threads()) == 2
    del loader
    gc.collect()
    assert wait_no_worker_threads(2.0) == []


def test_threads_started_before_one_fails_to_start_are_stopped(monkeypatch):
    # Under a thread limit ("can't start new thread") iter() raises, and the
    # workers already running must not be left waiting for jobs for ever.
    real_start, calls = threading.Thread.start, []

    def start(thread):
        if thread.name.startswith("threadloader-worker-"):
            calls.append(thread.name)
            if len(calls) == 2:
                raise RuntimeError("can't start new thread")
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    loader = ThreadDataLoader(Squares(10), batch_size=2, num_workers=2)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        iter(loader)
    assert len(calls) == 2
    assert wait_no_worker_threads(2.0) == []


def test_stats_report_work():
    loader = ThreadDataLoader(Slow(20, 0.002), batch_size=4, num_workers=2)
    list(loader)
    snap = loader.stats().snapshot()
    assert snap["batches"] == 5 and snap["items"] == 20 and snap["items_fetched"] == 20
    assert snap["fetch_s"] > 0.02
    assert 0 < snap["worker_utilization"] <= 1


def test_no_warning_for_a_plain_run():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(ThreadDataLoader(Squares(10), batch_size=2, num_workers=2))


@pytest.mark.parametrize("iterable", [False, True])
def test_pinning_exception_reaches_user(monkeypatch, iterable):
    # Without an accelerator DataLoader never pins; pretend one exists and make
    # pinning fail, as a bad custom batch type's pin_memory() would.
    import threadloader.engine.worker_loop as engine

    def failing_pin(data, device):
        raise MemoryError("cannot pin")

    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0)
    monkeypatch.setattr(engine, "pin_memory", failing_pin)
    dataset = Sharded(0, 4) if iterable else Squares(4)
    loader = ThreadDataLoader(dataset, batch_size=2, num_workers=1, pin_memory=True)
    monkeypatch.setattr(engine.torch.accelerator, "set_device_index", lambda i: None, raising=False)
    it = iter(loader)
    with pytest.raises(MemoryError, match="(?s)worker thread 0 \\(pin_memory\\).*cannot pin"):
        next(it)
    del it


@pytest.mark.parametrize("copier", ["pickle", "deepcopy"])
def test_loader_can_be_pickled_and_copied_like_dataloader(copier):
    import copy
    import pickle

    loader = ThreadDataLoader(Squares(10), batch_size=3, num_workers=2)
    list(loader)  # after an epoch, as Lightning/Accelerate may copy it
    clone = pickle.loads(pickle.dumps(loader)) if copier == "pickle" else copy.deepcopy(loader)
    assert type(clone) is ThreadDataLoader
    assert to_list(clone) == to_list(DataLoader(Squares(10), batch_size=3))


def test_batch_sampler_yielding_iterators_and_empty_batches():
    class IterBatches:
        def __iter__(self):
            yield iter([0, 1])
            yield (i for i in [3])

        def __len__(self):
            return 2

    got = to_list(ThreadDataLoader(Squares(4), batch_sampler=IterBatches(), num_workers=2))
    assert got == to_list(DataLoader(Squares(4), batch_sampler=IterBatches()))
    # an empty batch reaches collate_fn, which decides (default_collate raises)
    with pytest.raises(IndexError):
        list(ThreadDataLoader(Squares(4), batch_sampler=[[]], num_workers=1))
    with pytest.raises(IndexError):
        list(DataLoader(Squares(4), batch_sampler=[[]]))
    assert list(ThreadDataLoader(Squares(4), batch_sampler=[[]], num_workers=1, collate_fn=len)) == [0]


# --- bad input caught where DataLoader catches it --------------------------------------------

def test_prefetch_factor_0_fails_with_dataloaders_words():
    def error(cls):
        with pytest.raises(AssertionError) as info:
            iter(cls(Squares(4), num_workers=2, prefetch_factor=0))
        return str(info.value)

    assert error(ThreadDataLoader) == error(DataLoader)
