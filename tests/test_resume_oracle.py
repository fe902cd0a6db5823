"""Resume with torchdata's StatefulDataLoader as the oracle (issue 34).

Each case runs the same loader twice, uninterrupted and interrupted at a
batch (checkpoint, a new loader, ``load_state_dict``), with
``StatefulDataLoader`` and with ``ThreadDataLoader``. Where
StatefulDataLoader's resumed run equals its uninterrupted run, ours must
give the same batches. The datasets keep their randomness in state they
expose (``state_dict``), which is what StatefulDataLoader saves; the global
RNG is reseeded before the resume, as in a new process.
"""

from __future__ import annotations

import io
import json
import random
import warnings

import pytest
import torch
from helpers import to_list
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from threadloader import ThreadDataLoader

stateful = pytest.importorskip("torchdata.stateful_dataloader")
StatefulDataLoader = stateful.StatefulDataLoader

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # StatefulDataLoader's set_vital warning


# --- datasets whose randomness is their own, exposed state --------------------------------------

def _rng_state(rng: random.Random) -> list:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _set_rng_state(rng: random.Random, state: list) -> None:
    version, internal, gauss = state
    rng.setstate((version, tuple(internal), gauss))


class DrawingMap(Dataset):
    """Map-style: each ``__getitem__`` draws from the dataset's own generator, saved by ``state_dict``."""

    def __init__(self, n: int = 24) -> None:
        self.n = n
        self.rng = random.Random(5)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> list[int]:
        return [i, self.rng.randrange(1000)]

    def state_dict(self) -> dict:
        return {"rng": _rng_state(self.rng)}

    def load_state_dict(self, state: dict) -> None:
        _set_rng_state(self.rng, state["rng"])


def _shard(n: int) -> range:
    info = get_worker_info()
    return range(n) if info is None else range(info.id, n, info.num_workers)


class DrawingStream(IterableDataset):
    """Iterable: each worker's shard, each item drawn from the dataset's own generator (its state)."""

    def __init__(self, n: int = 24) -> None:
        self.n = n
        self.rng = random.Random(7)

    def __iter__(self):
        for i in _shard(self.n):
            yield [i, self.rng.randrange(1000)]

    def state_dict(self) -> dict:
        return {"rng": _rng_state(self.rng)}

    def load_state_dict(self, state: dict) -> None:
        _set_rng_state(self.rng, state["rng"])


class LateStateStream(IterableDataset):
    """Iterable whose state exists only once ``__iter__`` has run: its position in the shard.

    ``load_state_dict`` makes the next ``__iter__`` continue from the saved
    position, as StatefulDataLoader restores it (state first, then ``iter``).
    """

    def __init__(self, n: int = 24) -> None:
        self.n = n
        self._resume_at: int | None = None

    def __iter__(self):
        shard = list(_shard(self.n))
        start, self._resume_at = self._resume_at or 0, None
        self.pos = start  # the state: how many items of the shard were read
        return self._items(shard)

    def _items(self, shard: list[int]):
        while self.pos < len(shard):
            self.pos += 1
            yield [shard[self.pos - 1], self.pos]

    def state_dict(self) -> dict:
        return {"pos": self.pos}  # AttributeError before the first __iter__

    def load_state_dict(self, state: dict) -> None:
        self._resume_at = state["pos"]


class SelfIterating(IterableDataset):
    """Its own iterator, drawing from torch's global RNG."""

    def __init__(self, n: int = 7) -> None:
        self.n, self.i = n, 0

    def __iter__(self):
        self.i = 0
        return self

    def __next__(self) -> int:
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return int(torch.randint(1000, ()).item())


# --- the two runs -----------------------------------------------------------------------------

def _json(sd):
    return json.loads(json.dumps(sd))


def _torch_file(sd):
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _loop(loader) -> list:
    return to_list(loader)


def uninterrupted(make, epochs: int) -> list:
    torch.manual_seed(0)
    loader = make()
    return [_loop(loader) for _ in range(epochs)]


def resumed(make, epochs: int, stop_epoch: int, stop_batch: int | None, codec=_torch_file,
            reseed: int = 999, rest: bool = True) -> list:
    """Interrupted at batch ``stop_batch`` of ``stop_epoch`` (None: after that whole epoch), resumed in a new loader.

    After ``load_state_dict`` the first loop is the rest of the checkpointed
    epoch, then the later epochs. ``rest=False``: the first loop is the next
    epoch (ours, at a map-style epoch's last batch).
    """
    torch.manual_seed(0)
    loader = make()
    out = [_loop(loader) for _ in range(stop_epoch)]
    if stop_batch is None:
        out.append(_loop(loader))
        sd = codec(loader.state_dict())
    else:
        it = iter(loader)
        head = [to_list([next(it)])[0] for _ in range(stop_batch)]
        sd = codec(loader.state_dict())
        del it
        out.append(head)
    del loader
    torch.manual_seed(reseed)  # a new process
    again = make()
    again.load_state_dict(sd)
    if stop_batch is not None and rest:
        out[-1] = out[-1] + _loop(again)
    out += [_loop(again) for _ in range(stop_epoch + 1, epochs)]
    return out


def check_against_oracle(build, epochs: int, stop_epoch: int, stop_batch: int | None, codec=_torch_file,
                         reseed: int = 999, oracle_resumes: bool = True, at_end: bool = False, **ours) -> None:
    """StatefulDataLoader resumes this case exactly, and so do we, with the same batches.

    Args:
        build: ``build(cls, **extra)`` makes a loader of class ``cls``.
        oracle_resumes: False where StatefulDataLoader's own resume is not
            exact (then its uninterrupted run is the oracle, and ours must resume exactly).
        at_end: ``stop_batch`` is a map-style epoch's last: StatefulDataLoader's
            first loop after loading is empty, ours is the next epoch (see
            test_checkpoint_at_the_last_batch_next_iter_is_the_next_epoch).
        ours: extra arguments for ThreadDataLoader only (``worker_processes``).
    """
    oracle = lambda: build(StatefulDataLoader)  # noqa: E731
    mine = lambda: build(ThreadDataLoader, **ours)  # noqa: E731
    expected = uninterrupted(oracle, epochs)
    if oracle_resumes:
        assert resumed(oracle, epochs, stop_epoch, stop_batch, codec, reseed) == expected, "the oracle itself"
    assert uninterrupted(mine, epochs) == expected
    assert resumed(mine, epochs, stop_epoch, stop_batch, codec, reseed, rest=not at_end) == expected


def _builder(dataset_cls, n: int = 24, **kw):
    def build(cls, **extra):
        return cls(dataset_cls(n), **kw, **extra)
    return build


# --- 1. a map-style dataset (or sampler) with its own state -----------------------------------

@pytest.mark.parametrize("stop_batch", [1, 10])
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
def test_map_dataset_with_its_own_state(num_workers, persistent, stop_batch):
    if persistent and num_workers == 0:
        pytest.skip("persistent_workers needs workers")
    build = _builder(DrawingMap, 24, batch_size=2, num_workers=num_workers, persistent_workers=persistent)
    check_against_oracle(build, 2, 0 if stop_batch == 10 else 1, stop_batch)


@pytest.mark.parametrize("stop_batch", [1, 4])
def test_map_dataset_with_its_own_state_shuffled(stop_batch):
    # torch's RandomSampler, as DataLoader shuffles (torchdata's own draws its
    # permutation when iter() is called, and DataLoader calls it twice).
    def build(cls, **extra):
        ds = DrawingMap(20)
        return cls(ds, batch_size=3, num_workers=2, **extra,
                   sampler=torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(3)))

    check_against_oracle(build, 2, 0, stop_batch)


@pytest.mark.parametrize("persistent", [False, True])
def test_map_dataset_with_its_own_state_worker_processes(persistent):
    build = _builder(DrawingMap, 24, batch_size=2, num_workers=2, persistent_workers=persistent)
    check_against_oracle(build, 2, 1, 3, worker_processes=2)


# --- 2. persistent workers, a checkpoint between epochs --------------------------------------

# (19 samples: the workers' shards differ, and so do their copies' states.)
# StatefulDataLoader restores an IterableDataset's finished epoch and then
# prefetches from it before the next iter() (its workers draw one prefetch
# round ahead): its own resume is not exact there, its uninterrupted run is.
_ORACLE_RESUMES = {DrawingMap: True, DrawingStream: False}


@pytest.mark.parametrize("dataset_cls", [DrawingMap, DrawingStream], ids=["map", "iterable"])
@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_persistent_workers_checkpoint_between_epochs(dataset_cls, num_workers):
    build = _builder(dataset_cls, 19, batch_size=2, num_workers=num_workers, persistent_workers=True)
    check_against_oracle(build, 3, 0, None, oracle_resumes=_ORACLE_RESUMES[dataset_cls])


@pytest.mark.parametrize("dataset_cls", [DrawingMap, DrawingStream], ids=["map", "iterable"])
def test_persistent_workers_checkpoint_between_epochs_worker_processes(dataset_cls):
    build = _builder(dataset_cls, 19, batch_size=2, num_workers=2, persistent_workers=True)
    check_against_oracle(build, 3, 0, None, oracle_resumes=_ORACLE_RESUMES[dataset_cls], worker_processes=2)


# --- 3. an IterableDataset whose state exists once __iter__ ran ------------------------------

@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_state_made_in_iter(num_workers):
    build = _builder(LateStateStream, 20, batch_size=2, num_workers=num_workers)
    check_against_oracle(build, 2, 0, 3)


# --- 4. an IterableDataset that is its own iterator, drawing from the global RNG --------------

def test_self_iterating_dataset_checkpoint_before_the_first_batch():
    # StatefulDataLoader restores no global RNG: it resumes this exactly
    # when the global RNG is where it was when the loader was made.
    build = _builder(SelfIterating, 7, batch_size=None)
    check_against_oracle(build, 2, 0, 0, reseed=0)


# --- 5. a checkpoint at an epoch's last batch: where we differ ----------------------------------

# A map-style epoch whose last batch was received is over. StatefulDataLoader
# resumes it as an empty loop, then the next epoch; ours resumes at the next
# epoch. Lightning checkpoints there (ModelCheckpoint(every_n_train_steps=k),
# k the epoch's length) and its next epoch calls iter() once: with
# StatefulDataLoader that epoch trains on nothing (Lightning 2.6, torchdata
# 0.11: a 3-epoch fit resumed after epoch 0 trains 20 of its 30 batches), with
# ours on the uninterrupted fit's batches (test_fidelity_clients). Keeping
# Lightning right, we differ here. An IterableDataset's epoch ends only at
# StopIteration: there the next loop is the (empty) rest, as with StatefulDataLoader.

@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_checkpoint_at_the_last_batch_next_iter_is_the_next_epoch(num_workers, persistent):
    if persistent and num_workers == 0:
        pytest.skip("persistent_workers needs workers")
    build = _builder(DrawingMap, 12, batch_size=3, num_workers=num_workers, persistent_workers=persistent)
    check_against_oracle(build, 3, 1, 4, at_end=True)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_checkpoint_at_the_last_batch_then_an_empty_loop(num_workers):
    build = _builder(LateStateStream, 12, batch_size=3, num_workers=num_workers)
    check_against_oracle(build, 3, 1, 4)


# --- the state is JSON ------------------------------------------------------------------------

@pytest.mark.parametrize("num_workers", [0, 2])
def test_state_round_trips_through_json_and_resumes_identically(num_workers):
    def build(cls, **extra):
        return cls(list(range(20)), batch_size=3, shuffle=True, num_workers=num_workers, **extra)

    expected = uninterrupted(lambda: build(ThreadDataLoader), 2)
    assert resumed(lambda: build(ThreadDataLoader), 2, 0, 2, codec=_json) == expected
    assert resumed(lambda: build(ThreadDataLoader), 2, 0, None, codec=_json) == expected


def test_state_of_a_generator_loader_has_no_tensors():
    loader = ThreadDataLoader(list(range(10)), batch_size=2, shuffle=True, num_workers=2,
                              generator=torch.Generator().manual_seed(1))
    it = iter(loader)
    next(it)
    sd = loader.state_dict()
    del it
    assert json.loads(json.dumps(sd)) == sd


def test_a_state_of_the_tensor_format_is_one_value_error():
    # The format that held tensors was never released: refused, not converted.
    loader = ThreadDataLoader(list(range(10)), batch_size=2, shuffle=True, num_workers=2)
    it = iter(loader)
    next(it)
    sd = loader.state_dict()
    del it
    old = dict(sd, version=1)
    with pytest.raises(ValueError, match="^not a ThreadDataLoader state dict of version 2"):
        ThreadDataLoader(list(range(10)), batch_size=2, shuffle=True).load_state_dict(old)
    tensors = dict(sd, global_rng_state=torch.get_rng_state())
    with pytest.raises(ValueError, match="^not a valid ThreadDataLoader state dict: global_rng_state is not"):
        ThreadDataLoader(list(range(10)), batch_size=2, shuffle=True).load_state_dict(tensors)


# --- the interruption point, drawn ------------------------------------------------------------

@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(num_workers=st.integers(0, 3), persistent=st.booleans(), iterable=st.booleans(),
       stop_epoch=st.integers(0, 1), stop_batch=st.integers(0, 9))
def test_drawn_interruption_point(num_workers, persistent, iterable, stop_epoch, stop_batch):
    persistent = persistent and num_workers > 0
    dataset_cls = LateStateStream if iterable else DrawingMap
    build = _builder(dataset_cls, 18, batch_size=2, num_workers=num_workers, persistent_workers=persistent)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_against_oracle(build, 2, stop_epoch, stop_batch, at_end=not iterable and stop_batch == 9)
