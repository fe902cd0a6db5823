"""Epoch replay: the random state an epoch starts from, and what a resume replays.

An epoch's batches are a function of a few random states at the moment the
epoch starts (after the iterator drew its base seed, before the sampler drew
anything): the loader's ``generator`` or torch's global RNG, the generators of
torch's samplers, and the ``state_dict()`` of samplers and datasets that have
one. :class:`EpochStart` records them. :class:`ResumePlan` is what a resumed
iterator replays: that start, and the tasks to pass over. A map-style
dataset's tasks are skipped without fetching them. An IterableDataset's are
read again and dropped: its replicas can only be advanced by reading.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

import torch
from torch.utils.data import BatchSampler, DistributedSampler, SequentialSampler

from .progress import progress_record
from .rngstate import decode_rng_state, encode_rng_state
from .states import (
    CheckpointUnavailable,
    _attr,
    _epoch_of,
    _FailedState,
    _has_state,
    _sampler_objects,
    _state_of,
    start_state_of,
)

__all__ = ["DrawsAhead", "EpochStart", "ResumePlan", "draws_from_global_rng", "generators_of", "isolated_rng"]

_UNREAD = object()


@dataclass
class EpochStart:
    """Random state at the start of one epoch (after the base seed was drawn)."""

    base_seed: int
    rng_state: torch.Tensor  # of loader.generator, or torch's global RNG when it has none
    sampler_generators: dict[str, torch.Tensor] = field(default_factory=dict)
    sampler_states: dict[str, Any] = field(default_factory=dict)
    dataset_state: Any = None
    # ``epoch`` of samplers driven by ``set_epoch``: their order depends on it,
    # and on restart Lightning creates the iterator before calling set_epoch.
    sampler_epochs: dict[str, int] = field(default_factory=dict)
    # torch's global RNG too, when the loader has a generator but a sampler
    # may draw from the global one (see draws_from_global_rng).
    global_rng_state: torch.Tensor | None = None
    # An iterable DataPipe's shared seed for the epoch (its workers' random
    # pipes) when it was drawn before the states above (an iterator's first
    # epoch); None: the epoch draws it first from them (persistent workers' later epochs).
    shared_seed: int | None = None
    # The state of each worker's dataset copy at the epoch start, by worker
    # id: persistent workers' copies go on from epoch to epoch, as a worker
    # process's do. None: the copies are made from the loader's dataset.
    worker_states: list[Any] | None = None

    @classmethod
    def capture(cls, loader: Any, base_seed: int, dataset_state: Any = _UNREAD,
                shared_seed: int | None = None) -> "EpochStart":
        """Record the loader's random states now.

        Args:
            dataset_state: the dataset's state read earlier with
                :func:`start_state_of` (before an iterator was made from
                it); by default it is read now.
            shared_seed: the epoch's DataPipe seed, when already drawn.
        """
        gen = loader.generator
        rng_state = gen.get_state() if gen is not None else torch.get_rng_state()
        sampler_generators, sampler_states, sampler_epochs = {}, {}, {}
        for name, obj in _sampler_objects(loader).items():
            epoch = _epoch_of(obj)
            if epoch is not None:
                sampler_epochs[name] = epoch
            own = _attr(obj, "generator")
            if isinstance(own, torch.Generator) and own is not gen:
                sampler_generators[name] = own.get_state()
            if _has_state(obj):
                sampler_states[name] = _state_of(obj, name)
        if dataset_state is _UNREAD:
            dataset_state = start_state_of(loader.dataset)
        global_state = torch.get_rng_state() if gen is not None and draws_from_global_rng(loader) else None
        return cls(int(base_seed), rng_state, sampler_generators, sampler_states, dataset_state, sampler_epochs,
                   global_state, shared_seed)

    def to_record(self) -> dict[str, Any]:
        """This epoch start as plain values (generator states as base64 strings)."""
        record = asdict(self)
        record["rng_state"] = encode_rng_state(self.rng_state)
        record["sampler_generators"] = {k: encode_rng_state(v) for k, v in self.sampler_generators.items()}
        if self.global_rng_state is not None:
            record["global_rng_state"] = encode_rng_state(self.global_rng_state)
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> "EpochStart":
        """The epoch start :meth:`to_record` wrote (checked by :func:`check_state`)."""
        values = dict(record)
        values["rng_state"] = decode_rng_state(values["rng_state"])
        values["sampler_generators"] = {k: decode_rng_state(v)
                                        for k, v in values.get("sampler_generators", {}).items()}
        if values.get("global_rng_state") is not None:
            values["global_rng_state"] = decode_rng_state(values["global_rng_state"])
        return cls(**values)

    def check(self) -> None:
        """A checkpoint of this epoch needs every ``state_dict()`` taken at its start.

        Raises:
            CheckpointUnavailable: one of them raised (chained to its error).
        """
        for value in (*self.sampler_states.values(), self.dataset_state, *(self.worker_states or ())):
            if isinstance(value, _FailedState):
                raise CheckpointUnavailable(
                    f"cannot checkpoint this epoch: {value.owner}.state_dict() raised when it started: "
                    f"{value.error!r}") from value.error

    def apply(self, loader: Any) -> None:
        """Put the loader's random states back to this epoch start."""
        if loader.generator is not None:
            loader.generator.set_state(self.rng_state)
            if self.global_rng_state is not None:
                torch.set_rng_state(self.global_rng_state)
        else:
            torch.set_rng_state(self.rng_state)
        self.apply_to_objects(loader)

    def apply_to_objects(self, loader: Any) -> None:
        """Put the samplers' and the IterableDataset's own states back (not the loader's RNG)."""
        objs = _sampler_objects(loader)
        for name, epoch in self.sampler_epochs.items():
            if name in objs and _epoch_of(objs[name]) is not None:
                objs[name].set_epoch(epoch)
        for name, state in self.sampler_generators.items():
            if name in objs:
                objs[name].generator.set_state(state)
        for name, state in self.sampler_states.items():
            if name in objs:
                objs[name].load_state_dict(state)
        if self.dataset_state is not None:
            loader.dataset.load_state_dict(self.dataset_state)


@dataclass
class ResumePlan:
    """What a resumed iterator needs: the epoch start and the tasks to skip."""

    start: EpochStart
    consumed_prefix: int  # every task before this one was received
    consumed_extra: list[int]  # received out of order (in_order=False), beyond the prefix
    num_yielded: int
    # The start of an epoch that had made no draw when the checkpoint was
    # taken (a persistent iterator's next one; a num_workers=0 iterator before
    # its first next()): its draws move the loader's RNG for good, as they
    # would have, instead of being replayed on an isolated copy.
    fresh_epoch: bool = False
    # IterableDataset: batches each worker had delivered (None in older states).
    worker_received: list[int] | None = None
    # What each worker's dataset copy loads before it serves (None: nothing,
    # or no workers): a map-style dataset's state after the worker's last
    # received batch (the received ones are not fetched again); an
    # IterableDataset's at the epoch start (its batches are read again).
    worker_states: list[Any] | None = None
    # A map-style dataset's checkpointed states, by worker, as recorded (kept
    # for a checkpoint of this resume before it runs).
    recorded_states: list[Any] | None = None
    # An IterableDataset with its own state, by worker: the copy's state
    # right after the epoch's ``__iter__``, and after its last received batch.
    # Some states are positions, restored on load (as StatefulDataLoader
    # expects): ``__iter__`` from the epoch-start state then does not give the
    # first again. Such a resumed worker loads the second and goes on from it.
    iter_states: list[Any] | None = None
    resume_states: list[Any] | None = None

    def skips(self, task: int) -> bool:
        return task < self.consumed_prefix or task in self._extra

    def worker_skips(self, num_workers: int) -> list[int]:
        """IterableDataset: how many of each worker's first batches were received before the checkpoint.

        States that predate per-worker counts name tasks only; with the
        round-robin assignment of ``in_order=True`` task ``i`` is worker
        ``i % num_workers``'s, which gives the counts.
        """
        if self.worker_received is not None:
            return list(self.worker_received)
        counts = [0] * num_workers
        for task in [*range(self.consumed_prefix), *self._extra]:
            counts[task % num_workers] += 1
        return counts

    def __post_init__(self) -> None:
        self._extra = frozenset(self.consumed_extra)

    def record(self) -> dict[str, Any]:
        """The checkpoint record this plan was made from (a checkpoint taken before the resume ran)."""
        return progress_record(self.start, self.consumed_prefix, self.consumed_extra, self.num_yielded,
                               self.worker_received, self.fresh_epoch, self.recorded_states,
                               self.iter_states, self.resume_states)


class DrawsAhead:
    """Random draws a checkpoint made ahead of time, shown to it and held back from the user.

    A checkpoint at an epoch's last batch asks the sampler whether it is
    done, as the next ``next()`` would; a sampler may draw before it stops
    (RandomSampler's trailing ``randperm``). The checkpoint must hold the
    states after those draws (the epoch is over), but the live generators
    must not move until that ``next()`` comes: after a ``break`` it never
    does, as with DataLoader. Only the loader's and its samplers' own
    generators are held back (:func:`generators_of`); an error the sampler
    raised instead of ending is kept for that ``next()`` too.
    """

    def __init__(self, generators: list[torch.Generator], before: list[torch.Tensor], ended: bool,
                 error: Exception | None = None) -> None:
        self.ended = ended
        self.error = error
        after = [g.get_state() for g in generators]
        self._moved = [(g, b, a) for g, b, a in zip(generators, before, after) if not torch.equal(a, b)]

    def show(self) -> None:
        """The states after the draws (for a checkpoint)."""
        self._set(before=False)

    def hold_back(self) -> None:
        """The states before the draws (until the next ``next()``)."""
        self._set(before=True)

    def _set(self, before: bool) -> None:
        for g, b, a in self._moved:
            now, want = (a, b) if before else (b, a)
            # Only where nothing else drew in between. These generators are
            # the loader's own: only another iterator of the loader draws from
            # them; where one did, its draws are kept and the sampler's lost.
            if torch.equal(g.get_state(), now):
                g.set_state(want)


def generators_of(loader: Any) -> list[torch.Generator]:
    """The loader's and its samplers' own torch generators (each once).

    Not torch's global generator: other threads draw from it at any time, and
    putting its state back would hand them the same numbers again. A sampler
    drawing from it after its last index moves it when a checkpoint asks.
    """
    found: list[torch.Generator] = []
    for g in [loader.generator, *(_attr(o, "generator") for o in _sampler_objects(loader).values())]:
        if (isinstance(g, torch.Generator) and g.device.type == "cpu" and g is not torch.default_generator
                and not any(g is f for f in found)):
            found.append(g)
    return found


@contextlib.contextmanager
def isolated_rng(loader: Any) -> Iterator[None]:
    """Replay an epoch start without moving the global RNG the user sees.

    With a loader ``generator`` the replay moves only that generator, exactly
    as the interrupted run moved it. Without one (or when a sampler draws from
    the global RNG all the same: :func:`draws_from_global_rng`), the epoch's
    draws come from torch's global RNG; they are replayed on a saved copy and
    the global state is put back afterwards.
    """
    if not draws_from_global_rng(loader):
        yield
        return
    with torch.random.fork_rng(devices=[]):
        yield


def draws_from_global_rng(loader: Any) -> bool:
    """Whether an epoch of ``loader`` may draw from torch's global RNG.

    Always without a loader ``generator``. With one, torch's own samplers use
    it, but a sampler the user passed may still draw from the global RNG (a
    ``RandomSampler`` without a generator, a custom sampler): then its state
    is recorded and restored as well.
    """
    if loader.generator is None:
        return True
    for obj in _sampler_objects(loader).values():
        if isinstance(obj, (SequentialSampler, BatchSampler, DistributedSampler)):
            continue  # no draws, or seeded by seed + epoch
        if _attr(obj, "generator") is loader.generator:
            continue
        return True
    return False
