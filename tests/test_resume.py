"""state_dict / load_state_dict: exact mid-epoch resume."""

from __future__ import annotations

import collections
import functools
import io
import time

import pytest
import torch
from helpers import NoStateSampler, Sharded, Slow, Squares, to_list
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler, Sampler

from threadloader import ThreadDataLoader

EPOCHS = 3


def roundtrip(sd):
    """What a checkpoint file gives back."""
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def uninterrupted(make, epochs=EPOCHS, before_epoch=None):
    torch.manual_seed(0)
    loader = make()
    out = []
    for e in range(epochs):
        if before_epoch:
            before_epoch(loader, e)
        out.append(to_list(loader))
    return out


def interrupted(make, stop_epoch, stop_batch, epochs=EPOCHS, before_epoch=None, at_end=False):
    """Run until batch ``stop_batch`` of ``stop_epoch`` is received, checkpoint, resume in a new loader.

    ``at_end``: ``stop_batch`` is the epoch's last batch (a map-style epoch is
    then over: the resumed loader's next ``iter()`` starts the next epoch, as
    Lightning expects when it checkpoints at an epoch's last batch).
    """
    torch.manual_seed(0)
    loader = make()
    out = []
    for e in range(stop_epoch + 1):
        if before_epoch:
            before_epoch(loader, e)
        out.append([])
        it = iter(loader)
        limit = stop_batch if e == stop_epoch else None
        ended = False
        while limit is None or len(out[-1]) < limit:
            try:
                out[-1].append(to_list([next(it)])[0])
            except StopIteration:
                ended = True
                break
        if e == stop_epoch:
            sd = roundtrip(loader.state_dict())
            del it
    del loader
    torch.manual_seed(999)  # a new process: the global RNG is anywhere
    resumed = make()
    resumed.load_state_dict(sd)
    if not ended and not at_end:  # the rest of the interrupted epoch
        if before_epoch:
            before_epoch(resumed, stop_epoch)
        out[-1].extend(to_list(resumed))
    for e in range(stop_epoch + 1, epochs):
        if before_epoch:
            before_epoch(resumed, e)
        out.append(to_list(resumed))
    return out


@given(
    n=st.integers(1, 40),
    batch_size=st.integers(1, 6),
    num_workers=st.integers(0, 3),
    use_generator=st.booleans(),
    persistent=st.booleans(),
    stop_epoch=st.integers(0, EPOCHS - 1),
    stop_batch=st.integers(0, 8),
    drop_last=st.booleans(),
)
def test_resume_gives_the_uninterrupted_sequence(n, batch_size, num_workers, use_generator, persistent, stop_epoch,
                                                 stop_batch, drop_last):
    persistent = persistent and num_workers > 0

    def make():
        gen = torch.Generator().manual_seed(11) if use_generator else None
        return ThreadDataLoader(Squares(n), batch_size=batch_size, shuffle=True, num_workers=num_workers,
                                generator=gen, persistent_workers=persistent, drop_last=drop_last)

    expected = uninterrupted(make)
    stop_batch = min(stop_batch, len(expected[stop_epoch]))
    at_end = stop_batch == len(expected[stop_epoch])
    assert interrupted(make, stop_epoch, stop_batch, at_end=at_end) == expected


def test_resume_with_sampler_own_generator():
    def make():
        ds = Squares(30)
        return ThreadDataLoader(ds, batch_size=4, num_workers=2,
                                sampler=RandomSampler(ds, replacement=True, generator=torch.Generator().manual_seed(4)))

    assert interrupted(make, 1, 3) == uninterrupted(make)


class CountingStatefulSampler(Sampler):
    """A sampler whose order depends on its own state (a counter of epochs)."""

    def __init__(self, n):
        self.n, self.epoch = n, 0

    def __iter__(self):
        order = [(i * (self.epoch + 3)) % self.n for i in range(self.n)]
        self.epoch += 1
        return iter(order)

    def __len__(self):
        return self.n

    def state_dict(self):
        return {"epoch": self.epoch}

    def load_state_dict(self, sd):
        self.epoch = sd["epoch"]


def test_resume_uses_the_samplers_own_state_dict():
    make = lambda: ThreadDataLoader(Squares(17), batch_size=3, num_workers=2,  # noqa: E731
                                    sampler=CountingStatefulSampler(17))
    assert interrupted(make, 2, 2) == uninterrupted(make)


def test_resume_with_custom_batch_sampler_fast_forward():
    make = lambda: ThreadDataLoader(Squares(10), batch_sampler=[[1, 2], [0], [9, 8, 7], [3]], num_workers=2)  # noqa
    assert interrupted(make, 0, 2) == uninterrupted(make)


def test_resume_distributed_sampler_with_set_epoch():
    def make():
        ds = Squares(25)
        return ThreadDataLoader(ds, batch_size=2, num_workers=2,
                                sampler=DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=3))

    def before_epoch(loader, e):
        loader.sampler.set_epoch(e)

    expected = uninterrupted(make, before_epoch=before_epoch)
    assert interrupted(make, 1, 4, before_epoch=before_epoch) == expected


@pytest.mark.parametrize("num_workers", [0, 1, 3])
@pytest.mark.parametrize("uneven", [False, True])
def test_resume_iterable_dataset_by_fast_forward(num_workers, uneven):
    make = lambda: ThreadDataLoader(Sharded(0, 40, uneven=uneven), batch_size=2, num_workers=num_workers)  # noqa
    expected = uninterrupted(make)
    assert interrupted(make, 1, 2) == expected


class StatefulStream(IterableDataset):
    """An IterableDataset whose content depends on its own state."""

    def __init__(self):
        self.offset = 0

    def __iter__(self):
        start = self.offset
        self.offset += 100
        return iter(range(start, start + 7))

    def state_dict(self):
        return {"offset": self.offset}

    def load_state_dict(self, sd):
        self.offset = sd["offset"]


@pytest.mark.parametrize("num_workers", [0, 1])
def test_resume_iterable_dataset_with_its_own_state_dict(num_workers):
    # num_workers=0: torch's iterator calls iter() on the dataset as it is
    # built; the dataset's state must be read before, and restored before
    # the resumed epoch's iterator is made.
    make = lambda: ThreadDataLoader(StatefulStream(), batch_size=2, num_workers=num_workers)  # noqa: E731
    assert interrupted(make, 1, 2) == uninterrupted(make)


class OtherLoadersState(Sharded):
    """A ``state_dict`` that needs arguments: another loader's protocol (litdata's StreamingDataset)."""

    def state_dict(self, num_samples_yielded, num_workers, batch_size):
        raise AssertionError("not ours to call")

    def load_state_dict(self, state):
        raise AssertionError("not ours to call")


class OtherSamplersState(RandomSampler):
    def state_dict(self, epoch):
        raise AssertionError("not ours to call")

    def load_state_dict(self, state):
        raise AssertionError("not ours to call")


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("persistent", [False, True])
def test_a_state_dict_that_needs_arguments_is_not_ours_the_dataset_is_fast_forwarded(num_workers, persistent):
    make = lambda: ThreadDataLoader(OtherLoadersState(0, 30), batch_size=2, num_workers=num_workers,  # noqa: E731
                                    persistent_workers=persistent and num_workers > 0)
    expected = uninterrupted(make)
    assert interrupted(make, 1, 3) == expected
    assert _checkpoint_between_epochs(make) == expected


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_samplers_state_dict_that_needs_arguments_is_not_ours(num_workers):
    make = lambda: ThreadDataLoader(Squares(20), sampler=OtherSamplersState(range(20)), batch_size=3,  # noqa: E731
                                    num_workers=num_workers)
    assert interrupted(make, 1, 2) == uninterrupted(make)


@pytest.mark.parametrize("stop_epoch,stop_batch", [(1, 2), (1, 0), (0, 99)],
                         ids=["mid_epoch", "epoch_start", "between_epochs"])
def test_persistent_workers_resume_the_state_of_their_own_dataset_copies(stop_epoch, stop_batch):
    # Persistent workers iterate their copies, whose state goes on from
    # epoch to epoch (as in worker processes); the loader's own dataset is
    # never iterated. The checkpoint recorded the latter: every epoch after
    # the first was replayed from the first epoch's state.
    def make(cls=ThreadDataLoader):
        return cls(StatefulStream(), batch_size=2, num_workers=1, persistent_workers=True)

    expected = uninterrupted(make)
    assert expected == uninterrupted(functools.partial(make, DataLoader))
    assert expected[1][0] == [100, 101]  # epoch 1 goes on from the state epoch 0 left
    assert interrupted(make, stop_epoch, stop_batch) == expected


@pytest.mark.parametrize("num_workers", [1, 3])
def test_in_order_false_resume_loses_and_duplicates_nothing(num_workers):
    def make():
        return ThreadDataLoader(Squares(40), batch_size=3, shuffle=True, num_workers=num_workers, in_order=False,
                                generator=torch.Generator().manual_seed(2))

    expected = uninterrupted(make, epochs=2)
    got = interrupted(make, 0, 5, epochs=2)
    for e in range(2):
        assert collections.Counter(map(repr, got[e])) == collections.Counter(map(repr, expected[e]))


def test_state_between_epochs_and_before_any_epoch():
    def make():
        return ThreadDataLoader(Squares(12), batch_size=5, shuffle=True, num_workers=2)

    expected = uninterrupted(make)
    torch.manual_seed(0)
    loader = make()
    first = to_list(loader)
    sd = roundtrip(loader.state_dict())
    assert sd["epoch"] is None
    torch.manual_seed(5)
    resumed = make()
    resumed.load_state_dict(sd)
    assert [first, to_list(resumed), to_list(resumed)] == expected


def test_prefetched_batches_are_not_lost():
    loader = ThreadDataLoader(Squares(30), batch_size=2, num_workers=3, prefetch_factor=4)
    it = iter(loader)
    got = [to_list([next(it)])[0] for _ in range(2)]
    sd = loader.state_dict()
    assert sd["epoch"]["consumed_prefix"] == 2
    resumed = ThreadDataLoader(Squares(30), batch_size=2, num_workers=3, prefetch_factor=4)
    resumed.load_state_dict(sd)
    assert got + to_list(resumed) == to_list(ThreadDataLoader(Squares(30), batch_size=2))
    del it


def test_bad_state_dict_is_rejected():
    with pytest.raises(ValueError, match="not a ThreadDataLoader state dict"):
        ThreadDataLoader(Squares(3)).load_state_dict({"foo": 1})


def test_in_order_false_bookkeeping_stays_bounded():
    loader = ThreadDataLoader(Slow(3000, 0.0002, slow=set(range(0, 3000, 7))), batch_size=2, num_workers=2,
                              in_order=False)
    it = iter(loader)
    for _ in range(1200):
        next(it)
        # only tasks received ahead of the oldest outstanding one are remembered
        assert all(i >= it._rcvd_idx for i in it._consumed_ahead)
        assert len(it._consumed_ahead) < 100
    del it


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_failing_state_dict_does_not_break_iteration_only_a_checkpoint(num_workers):
    from threadloader.state import CheckpointUnavailable

    loader = ThreadDataLoader(Squares(4), sampler=NoStateSampler(4), batch_size=2, num_workers=num_workers)
    assert to_list(loader) == to_list(DataLoader(Squares(4), sampler=NoStateSampler(4), batch_size=2))
    it = iter(loader)
    next(it)
    with pytest.raises(CheckpointUnavailable, match="sampler.state_dict.*no state yet") as info:
        loader.state_dict()
    assert isinstance(info.value.__cause__, NotImplementedError)
    del it  # dropped mid-epoch: the checkpoint still cannot be taken, and says why
    with pytest.raises(CheckpointUnavailable):
        loader.state_dict()


def _checkpoint_between_epochs(make, epochs=EPOCHS, after=1):
    """Run ``after`` whole epochs, checkpoint between epochs, resume the rest in a new loader."""
    torch.manual_seed(0)
    loader = make()
    out = [to_list(loader) for _ in range(after)]
    sd = roundtrip(loader.state_dict())
    assert sd["epoch"] is None
    del loader
    torch.manual_seed(999)
    resumed = make()
    resumed.load_state_dict(sd)
    return out + [to_list(resumed) for _ in range(epochs - after)]


@pytest.mark.parametrize("use_generator", [False, True])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_between_epochs_persistent_workers_and_samplers_own_state(use_generator, num_workers):
    # A persistent iterator draws its base seed once: a new one must not
    # draw another. Samplers' own generators and states are saved too.
    def shuffled():
        gen = torch.Generator().manual_seed(11) if use_generator else None
        return ThreadDataLoader(Squares(12), batch_size=3, shuffle=True, num_workers=num_workers, generator=gen,
                                persistent_workers=num_workers > 0)

    def own_generator():
        ds = Squares(11)
        return ThreadDataLoader(ds, batch_size=3, num_workers=num_workers,
                                sampler=RandomSampler(ds, generator=torch.Generator().manual_seed(4)))

    def own_state():
        return ThreadDataLoader(Squares(11), batch_size=3, num_workers=num_workers,
                                sampler=CountingStatefulSampler(11))

    for make in (shuffled, own_generator, own_state):
        assert _checkpoint_between_epochs(make) == uninterrupted(make), make.__name__


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_generator_with_a_sampler_drawing_from_the_global_rng(num_workers):
    def make():
        ds = Squares(12)
        return ThreadDataLoader(ds, batch_size=3, num_workers=num_workers, sampler=RandomSampler(ds),
                                generator=torch.Generator().manual_seed(1))

    assert interrupted(make, 1, 2) == uninterrupted(make)


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_checkpoint_at_the_last_batch_resumes_at_the_next_epoch(persistent, num_workers):
    # Lightning checkpoints at the epoch's last batch, before StopIteration,
    # and then starts the next epoch: the resumed loader's next iter() must
    # be that epoch, not an empty rest of the finished one.
    def make():
        return ThreadDataLoader(Squares(9), batch_size=3, shuffle=True, num_workers=num_workers,
                                persistent_workers=persistent and num_workers > 0)

    assert interrupted(make, 1, 3, at_end=True) == uninterrupted(make)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_checkpoint_at_the_last_batch_with_a_generator_resumes_at_the_next_epoch(num_workers):
    # The checkpoint holds the generator after RandomSampler's trailing
    # randperm (the epoch is over), though the live generator makes that
    # draw only at the next next() (see test_fidelity_clients).
    def make():
        return ThreadDataLoader(Squares(9), batch_size=3, shuffle=True, num_workers=num_workers,
                                generator=torch.Generator().manual_seed(4))

    assert interrupted(make, 1, 3, at_end=True) == uninterrupted(make)


class _TwoSpeedStream(IterableDataset):
    """Worker ``slow`` sleeps before each item: which worker serves which task depends on it."""

    slow = 0

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        for k in range(6):
            if info.id == type(self).slow:
                time.sleep(0.05)
            yield info.id * 100 + k


def test_iterable_in_order_false_resume_counts_each_workers_batches():
    # With in_order=False the task numbers a worker serves depend on timing,
    # so the resumed run (here: the other worker is the slow one) must skip
    # each worker's first batches, not tasks by number.
    def make():
        return ThreadDataLoader(_TwoSpeedStream(), batch_size=None, num_workers=2, in_order=False)

    _TwoSpeedStream.slow = 0
    full = sorted(int(b) for b in make())
    loader = make()
    it = iter(loader)
    got = [int(next(it)) for _ in range(3)]
    sd = roundtrip(loader.state_dict())
    del it, loader
    _TwoSpeedStream.slow = 1
    resumed = make()
    resumed.load_state_dict(sd)
    got += [int(b) for b in resumed]
    assert sorted(got) == full


@pytest.mark.parametrize("use_generator", [False, True])
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("drop", [False, True])
def test_checkpoint_before_the_first_batch_live_or_after_break(use_generator, num_workers, drop):
    # num_workers=0 draws nothing before the first next(), as DataLoader: the
    # record is where the epoch starts, and resuming it makes the epoch's
    # draws for good, as the interrupted iterator would have.
    def make():
        gen = torch.Generator().manual_seed(11) if use_generator else None
        return ThreadDataLoader(Squares(10), batch_size=3, shuffle=True, num_workers=num_workers, generator=gen)

    torch.manual_seed(0)
    loader = make()
    out = [to_list(loader)]
    it = iter(loader)
    assert it is not None
    if drop:
        del it  # ``break`` before the first batch
        sd = roundtrip(loader.state_dict())
    else:
        sd = roundtrip(loader.state_dict())
        del it
    torch.manual_seed(999)
    resumed = make()
    resumed.load_state_dict(sd)
    out += [to_list(resumed), to_list(resumed)]
    assert out == uninterrupted(make)


# --- a checkpoint of a resume that has not run yet, or has not passed its skips ----------------

def _shuffled(nw: int = 2, **kw) -> ThreadDataLoader:
    return ThreadDataLoader(list(range(12)), batch_size=2, num_workers=nw, shuffle=True, **kw)


def _taken_then_checkpoint(make, k: int):
    torch.manual_seed(0)
    loader = make()
    it = iter(loader)
    got = [next(it).tolist() for _ in range(k)]
    sd = loader.state_dict()
    del it
    return got, sd


@pytest.mark.parametrize("nw", [0, 2])
@pytest.mark.parametrize("iterated", [False, True], ids=["loaded", "iter_made"])
def test_a_checkpoint_of_a_resume_before_its_first_batch_keeps_the_position(nw, iterated):
    # Preempted again right after restoring: the second checkpoint is the first one's position.
    torch.manual_seed(0)
    expected = [b.tolist() for b in _shuffled(nw)]
    got, sd = _taken_then_checkpoint(lambda: _shuffled(nw), 2)
    second = _shuffled(nw)
    second.load_state_dict(roundtrip(sd))
    it = iter(second) if iterated else None
    sd2 = second.state_dict()
    del it
    third = _shuffled(nw)
    third.load_state_dict(roundtrip(sd2))
    assert got + [b.tolist() for b in third] == expected


def test_loading_a_state_replaces_the_position_of_a_live_iterator():
    torch.manual_seed(0)
    loader = _shuffled()
    it = iter(loader)
    next(it)
    next(it)
    sd = loader.state_dict()
    next(it)
    loader.load_state_dict(sd)
    assert loader.state_dict()["epoch"]["consumed_prefix"] == 2
    between = ThreadDataLoader(list(range(12)), batch_size=2).state_dict()
    loader.load_state_dict(between)
    assert loader.state_dict()["epoch"] is None
    del it


def test_a_resumed_iterable_epoch_counts_its_skipped_batches_before_receiving_them():
    make = lambda: ThreadDataLoader(Sharded(0, 40), batch_size=2, num_workers=2, in_order=False)  # noqa: E731
    loader = make()
    it = iter(loader)
    got = [next(it) for _ in range(3)]
    sd = loader.state_dict()
    del it
    resumed = make()
    resumed.load_state_dict(sd)
    it = iter(resumed)
    assert resumed.state_dict()["epoch"]["worker_received"] == sd["epoch"]["worker_received"]
    rest = list(it)
    assert sorted(x for b in got + rest for x in b.tolist()) == list(range(40))


class _PerIndexSampler(Sampler):
    """Draws each index from torch's global RNG when it is asked for it (not a permutation up front)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        for _ in range(self.n):
            yield int(torch.randint(100, ()).item())


def test_num_workers_0_resume_with_a_sampler_drawing_per_index():
    make = lambda: ThreadDataLoader(list(range(100)), batch_size=2, sampler=_PerIndexSampler(12))  # noqa: E731
    torch.manual_seed(0)
    expected = [b.tolist() for b in make()]
    got, sd = _taken_then_checkpoint(make, 2)
    resumed = make()
    resumed.load_state_dict(sd)
    assert got + [b.tolist() for b in resumed] == expected


@pytest.mark.parametrize("nw", [0, 2])
def test_a_batch_whose_fetch_raised_counts_as_received(nw):
    # DataLoader goes on with the next batch after an error: resume must not fetch it again.
    class FailsAt4(torch.utils.data.Dataset):
        def __len__(self):
            return 12

        def __getitem__(self, i):
            if i == 4:
                raise ValueError("bad sample")
            return i

    make = lambda: ThreadDataLoader(FailsAt4(), batch_size=2, num_workers=nw)  # noqa: E731
    loader = make()
    it = iter(loader)
    got = [next(it).tolist(), next(it).tolist()]
    with pytest.raises(ValueError, match="bad sample"):
        next(it)
    got.append(next(it).tolist())
    sd = loader.state_dict()
    del it
    resumed = make()
    resumed.load_state_dict(sd)
    assert [b.tolist() for b in resumed] == [[8, 9], [10, 11]]
    assert got == [[0, 1], [2, 3], [6, 7]]


@pytest.mark.parametrize("base, change, key", [
    ({}, dict(batch_size=3), "batch_size"),
    ({}, dict(n=10), "batches"),
    ({}, dict(generator=True), "generator"),
    (dict(n=13), dict(drop_last=True, n=13), "drop_last"),
])
def test_a_mid_epoch_state_of_a_loader_built_differently_is_refused(base, change, key):
    def make(n=12, batch_size=2, generator=False, drop_last=False):
        gen = torch.Generator().manual_seed(0) if generator else None
        return ThreadDataLoader(list(range(n)), batch_size=batch_size, num_workers=2, shuffle=True,
                                generator=gen, drop_last=drop_last)

    _, sd = _taken_then_checkpoint(lambda: make(**base), 2)
    other = make(**change)
    with pytest.raises(ValueError, match=rf"^this state dict is from a loader with {key}=.*built the same way$"):
        other.load_state_dict(sd)
    make(**base).load_state_dict(sd)  # the same loader takes it


@pytest.mark.parametrize("nw", [0, 1, 3])
def test_an_iterable_mid_epoch_state_needs_the_same_num_workers(nw):
    _, sd = _taken_then_checkpoint(lambda: ThreadDataLoader(Sharded(0, 24), batch_size=2, num_workers=2), 3)
    with pytest.raises(ValueError, match="num_workers=2, but this loader has num_workers="):
        ThreadDataLoader(Sharded(0, 24), batch_size=2, num_workers=nw).load_state_dict(sd)


_CORRUPTIONS = {
    "no prefix": lambda s: s["epoch"].pop("consumed_prefix"),
    "no start": lambda s: s["epoch"].pop("start"),
    "no base seed": lambda s: s["epoch"]["start"].pop("base_seed"),
    "epoch not a dict": lambda s: s.__setitem__("epoch", 5),
    "prefix a string": lambda s: s["epoch"].__setitem__("consumed_prefix", "2"),
    "prefix negative": lambda s: s["epoch"].__setitem__("consumed_prefix", -3),
    "prefix past the epoch": lambda s: s["epoch"].__setitem__("consumed_prefix", 100),
    "extra past the epoch": lambda s: s["epoch"].__setitem__("consumed_extra", [50]),
    "rng state truncated": lambda s: s.__setitem__("global_rng_state", s["global_rng_state"][:5]),
    "start rng state a list": lambda s: s["epoch"]["start"].__setitem__("rng_state", [1, 2]),
    "unknown start key": lambda s: s["epoch"]["start"].__setitem__("colour", 1),
}


@pytest.mark.parametrize("name", sorted(_CORRUPTIONS))
def test_a_corrupted_state_is_one_value_error_and_changes_nothing(name):
    _, sd = _taken_then_checkpoint(_shuffled, 2)
    _CORRUPTIONS[name](sd)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    loader = _shuffled()
    with pytest.raises(ValueError, match="^not a valid ThreadDataLoader state dict: [^\n]*$"):
        loader.load_state_dict(sd)
    assert torch.equal(torch.get_rng_state(), before)
    assert loader.state_dict()["epoch"] is None  # nothing pending
