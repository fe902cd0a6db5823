"""Mid-epoch resume: what a checkpoint holds and how an epoch is replayed.

An epoch's batches are a function of a few random states at the moment the
epoch starts (after the iterator drew its base seed, before the sampler drew
anything): the loader's ``generator`` or torch's global RNG, the generators of
torch's samplers, and the ``state_dict()`` of samplers and IterableDatasets
that have one. :class:`EpochStart` records them. A checkpoint is that record
plus which of the epoch's tasks the consumer already received. Resuming
restores the record, builds the same epoch again and skips the received tasks
without fetching them (map-style), or fetches and drops them (IterableDataset,
whose replicas can only be advanced by reading).

Everything in a state dict is a plain Python value or a CPU tensor, so
``torch.save`` writes it.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Iterator, TypeGuard

import torch
from torch.utils.data import BatchSampler, DistributedSampler, IterableDataset, SequentialSampler

STATE_VERSION = 1


def _attr(obj: Any, name: str) -> Any:
    """``getattr(obj, name, None)``, also None when a ``__getattr__`` raises another error.

    The optional attributes looked for here (``epoch``, ``state_dict``,
    ``generator``...) are ours to ask for, not DataLoader's: a proxy whose
    ``__getattr__`` raises ``KeyError`` for names it does not know must work
    as it does with DataLoader, which never asks.
    """
    try:
        return getattr(obj, name, None)
    except Exception:  # noqa: BLE001
        return None


def _sampler_objects(loader: Any) -> dict[str, Any]:
    """The sampler-like objects of a loader whose state decides an epoch's order."""
    objs = {"sampler": loader.sampler, "batch_sampler": loader.batch_sampler}
    inner = _attr(loader.batch_sampler, "sampler")
    if inner is not None and inner is not loader.sampler:
        objs["batch_sampler.sampler"] = inner
    return {k: v for k, v in objs.items() if v is not None}


def _has_state(obj: Any) -> bool:
    """Whether ``obj`` keeps its own state for us: ``state_dict()`` (no arguments) and ``load_state_dict``.

    A ``state_dict`` that needs arguments follows another loader's protocol
    (litdata's ``StreamingDataset.state_dict(num_samples_yielded, num_workers,
    batch_size)``, which its ``StreamingDataLoader`` calls): not ours to call,
    so such an object is fast-forwarded like one without a state.
    """
    state_dict = _attr(obj, "state_dict")
    return callable(state_dict) and callable(_attr(obj, "load_state_dict")) and _takes_no_arguments(state_dict)


def _takes_no_arguments(fn: Callable[..., Any]) -> bool:
    try:
        inspect.signature(fn).bind()
    except TypeError:
        return False
    except ValueError:  # no signature to read (some builtins): assume it does
        return True
    return True


def _epoch_of(obj: Any) -> int | None:
    """The epoch of a sampler driven by ``set_epoch`` (DistributedSampler and alike), else None."""
    epoch = _attr(obj, "epoch")
    if isinstance(epoch, int) and not isinstance(epoch, bool) and callable(_attr(obj, "set_epoch")):
        return epoch
    return None


class CheckpointUnavailable(RuntimeError):
    """A ``state_dict()`` of this epoch's sampler or IterableDataset raised when the epoch started."""


class _FailedState:
    """A ``state_dict()`` that raised at an epoch's start: an error only if a checkpoint is asked for."""

    __slots__ = ("error", "owner")

    def __init__(self, error: Exception, owner: str) -> None:
        self.error, self.owner = error, owner


def _state_of(obj: Any, owner: str) -> Any:
    # DataLoader never calls state_dict(): iterating must not fail because of
    # it. Only a checkpoint of this epoch needs the value.
    try:
        return obj.state_dict()
    except Exception as e:  # noqa: BLE001 - kept, raised by EpochStart.check
        return _FailedState(e, owner)


def dataset_state_of(dataset: Any) -> Any:
    """The ``state_dict()`` of an IterableDataset (a loader's, or a worker's copy of it) that has one; else None."""
    if isinstance(dataset, IterableDataset) and _has_state(dataset):
        return _state_of(dataset, "dataset")
    return None


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

    @classmethod
    def capture(cls, loader: Any, base_seed: int, dataset_state: Any = None,
                shared_seed: int | None = None) -> "EpochStart":
        """Record the loader's random states now.

        Args:
            dataset_state: the IterableDataset's state read earlier with
                :func:`dataset_state_of` (before an iterator was made from
                it); None reads it now.
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
        if dataset_state is None:
            dataset_state = dataset_state_of(loader.dataset)
        global_state = torch.get_rng_state() if gen is not None and draws_from_global_rng(loader) else None
        return cls(int(base_seed), rng_state, sampler_generators, sampler_states, dataset_state, sampler_epochs,
                   global_state, shared_seed)

    def check(self) -> None:
        """A checkpoint of this epoch needs every ``state_dict()`` taken at its start.

        Raises:
            CheckpointUnavailable: one of them raised (chained to its error).
        """
        for value in (*self.sampler_states.values(), self.dataset_state):
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
                               self.worker_received, self.fresh_epoch)


class ProgressBox:
    """Where an iterator leaves its epoch record when it is dropped.

    The loader holds the box, not the iterator (holding the iterator would keep
    its worker threads alive after ``break``), so ``state_dict()`` taken after
    the iterator is gone still names the batches that remain.
    """

    __slots__ = ("record", "error")

    def __init__(self) -> None:
        self.record: dict[str, Any] | None = None
        self.error: CheckpointUnavailable | None = None  # raised by the loader's state_dict()


class RecordsProgressOnDrop:
    """Mixin for iterators with ``progress()``: on drop, the record goes to ``progress_box``."""

    progress_box: ProgressBox | None = None

    def _progress_on_drop(self) -> dict[str, Any] | None:
        """The record of an iterator that will never be asked for another batch."""
        return self.progress()  # type: ignore[attr-defined]

    def checkpoint_taken(self) -> None:
        """Called by the loader once a state dict was made from ``progress()``."""

    # Bound now: at interpreter exit a module's globals (``sys``) may already
    # be None when the last iterators are collected.
    def __del__(self, _is_finalizing: Any = sys.is_finalizing) -> None:
        box = self.progress_box
        if box is None or _is_finalizing():  # no checkpoint is taken after exit; torch may be torn down
            return
        try:
            box.record = self._progress_on_drop()
        except CheckpointUnavailable as e:
            box.record, box.error = None, e
        except Exception:  # noqa: BLE001 - a half-built iterator, or interpreter exit
            box.record = None


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


def make_state(loader: Any, progress: dict[str, Any] | None, persistent_base_seed: int | None = None,
               dataset_state: Any = None) -> dict[str, Any]:
    """The loader's state dict.

    Args:
        loader: the ThreadDataLoader.
        progress: the live iterator's epoch record and received tasks, or None
            between epochs.
        persistent_base_seed: between epochs, the base seed of the loader's
            persistent iterator (its next epoch draws none), else None.
        dataset_state: between epochs, the IterableDataset state the next
            epoch starts from when it is not the loader's dataset's (persistent
            workers' copies), else None.
    """
    state = {
        "version": STATE_VERSION,
        "loader": loader_shape(loader),
        "epoch": progress,
        # Later epochs shuffle from the global RNG when there is no generator
        # (or a sampler draws from it all the same).
        "global_rng_state": torch.get_rng_state() if draws_from_global_rng(loader) else None,
        "generator_state": loader.generator.get_state() if loader.generator is not None and progress is None else None,
    }
    if progress is None:
        # What the next epoch starts from besides the loader's RNG: samplers'
        # own generators and states, the IterableDataset's state, and a
        # persistent iterator's base seed.
        start = EpochStart.capture(loader, persistent_base_seed or 0, dataset_state)
        start.check()
        state["next_epoch"] = {"start": asdict(start), "persistent": persistent_base_seed is not None}
    return state


def progress_record(start: EpochStart, prefix: int, extra: list[int], num_yielded: int,
                    worker_received: list[int] | None = None, fresh: bool = False) -> dict[str, Any]:
    """An epoch's checkpoint record (``fresh``: taken before the epoch made any draw; see ResumePlan)."""
    start.check()
    record = {
        "start": asdict(start),
        "consumed_prefix": int(prefix),
        "consumed_extra": sorted(int(i) for i in extra),
        "num_yielded": int(num_yielded),
    }
    if worker_received is not None:
        record["worker_received"] = [int(n) for n in worker_received]
    if fresh:
        record["fresh"] = True
    return record


def unavailable_state(error: CheckpointUnavailable) -> dict[str, Any]:
    """A state dict that records why this epoch could not be checkpointed; loading it raises that."""
    return {"version": STATE_VERSION, "epoch": None, "unavailable": str(error)}


def loader_shape(loader: Any) -> dict[str, Any]:
    """What a mid-epoch position depends on besides random state: a resumed loader must have the same."""
    shape: dict[str, Any] = {
        "batch_size": loader.batch_size,
        "drop_last": bool(loader.drop_last),
        "generator": loader.generator is not None,
    }
    if isinstance(loader.dataset, IterableDataset):
        shape["num_workers"] = loader.num_workers  # each worker's replica has its own position
    else:
        try:
            shape["batches"] = len(loader)  # map-style: the batch sampler's length
        except Exception:  # noqa: BLE001 - a sampler without a usable len(): no length to check
            # (TypeError: none; NotImplementedError: declined; ValueError: a
            # negative one, as Accelerate's skip sampler has past the end.)
            pass
    return shape


_RNG_STATE_BYTES = torch.get_rng_state().numel()


def _bad(what: str) -> ValueError:
    return ValueError(f"not a valid ThreadDataLoader state dict: {what}")


def _is_count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_rng_state(value: Any, name: str) -> None:
    if not (isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.numel() == _RNG_STATE_BYTES):
        raise _bad(f"{name} is not a CPU generator state")


def _check_start(start: Any, name: str) -> None:
    if not isinstance(start, dict) or not {"base_seed", "rng_state"} <= start.keys():
        raise _bad(f"{name} lacks base_seed or rng_state")
    unknown = start.keys() - {f.name for f in fields(EpochStart)}
    if unknown:
        raise _bad(f"{name} has unknown keys {sorted(unknown)}")
    if not isinstance(start["base_seed"], int):
        raise _bad(f"{name}.base_seed is not an int")
    if not isinstance(start.get("shared_seed"), (int, type(None))):
        raise _bad(f"{name}.shared_seed is not an int or None")
    _check_rng_state(start["rng_state"], f"{name}.rng_state")
    if start.get("global_rng_state") is not None:
        _check_rng_state(start["global_rng_state"], f"{name}.global_rng_state")


def _check_epoch(epoch: Any, batches: int | None) -> None:
    if not isinstance(epoch, dict):
        raise _bad(f"epoch is a {type(epoch).__name__}, not a dict or None")
    _check_start(epoch.get("start"), "epoch.start")
    prefix, extra = epoch.get("consumed_prefix"), epoch.get("consumed_extra")
    if not _is_count(prefix) or not _is_count(epoch.get("num_yielded")):
        raise _bad("epoch.consumed_prefix and epoch.num_yielded must be counts (ints >= 0)")
    if not isinstance(extra, list) or not all(_is_count(i) and i >= prefix for i in extra):
        raise _bad("epoch.consumed_extra must be a list of task numbers beyond consumed_prefix")
    if batches is not None and (prefix > batches or any(i >= batches for i in extra)):
        raise _bad(f"epoch names batches beyond the {batches} of an epoch")
    received = epoch.get("worker_received")
    if received is not None and not (isinstance(received, list) and all(_is_count(n) for n in received)):
        raise _bad("epoch.worker_received must be a list of counts")


def check_state(loader: Any, state: Any) -> None:
    """Refuse a state dict that is malformed, or whose mid-epoch position belongs to another loader.

    Nothing is applied before this passes, so a refused load leaves every
    random state as it was.

    Raises:
        ValueError: one line saying what is wrong.
    """
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION or "epoch" not in state:
        raise ValueError(
            f"not a ThreadDataLoader state dict of version {STATE_VERSION}: "
            f"{sorted(state) if isinstance(state, dict) else type(state).__name__}"
        )
    for name in ("global_rng_state", "generator_state"):
        if state.get(name) is not None:
            _check_rng_state(state[name], name)
    epoch, recorded = state["epoch"], state.get("loader")
    if epoch is None:
        upcoming = state.get("next_epoch")
        if upcoming is not None:
            if not isinstance(upcoming, dict) or not isinstance(upcoming.get("persistent"), bool):
                raise _bad("next_epoch is not a dict with a bool 'persistent'")
            _check_start(upcoming.get("start"), "next_epoch.start")
        return
    shape = loader_shape(loader)
    if recorded is not None:  # states written before it was recorded are taken as they are
        if not isinstance(recorded, dict):
            raise _bad("loader is not a dict")
        for key, now in shape.items():
            if key in recorded and recorded[key] != now:
                raise ValueError(
                    f"this state dict is from a loader with {key}={recorded[key]!r}, but this loader has "
                    f"{key}={now!r}: a position inside an epoch resumes only on a loader built the same way")
    _check_epoch(epoch, shape.get("batches"))


def plan_from_state(loader: Any, state: dict[str, Any]) -> ResumePlan | None:
    """Validate a state dict, restore its between-epoch RNG state, and plan the resume.

    Raises:
        ValueError: the dict is not a valid threadloader state of a known version, or
            its mid-epoch position is of a loader built differently (see :func:`check_state`).
        CheckpointUnavailable: the state records that its epoch could not be checkpointed.
    """
    if isinstance(state, dict) and state.get("unavailable"):
        raise CheckpointUnavailable(state["unavailable"])
    check_state(loader, state)
    if state.get("global_rng_state") is not None:
        torch.set_rng_state(state["global_rng_state"])
    if state.get("generator_state") is not None and loader.generator is not None:
        loader.generator.set_state(state["generator_state"])
    epoch = state["epoch"]
    if epoch is None:
        upcoming = state.get("next_epoch")
        if upcoming is None:
            return None
        start = EpochStart(**upcoming["start"])
        if upcoming["persistent"] and loader.persistent_workers and loader.num_workers > 0:
            # The uninterrupted run's persistent iterator draws no base seed for
            # its next epoch: the new one takes the old one's and starts from here.
            return ResumePlan(start=start, consumed_prefix=0, consumed_extra=[], num_yielded=0, fresh_epoch=True)
        start.apply_to_objects(loader)
        return None
    return ResumePlan(
        start=EpochStart(**epoch["start"]),
        consumed_prefix=epoch["consumed_prefix"],
        consumed_extra=list(epoch["consumed_extra"]),
        num_yielded=epoch["num_yielded"],
        worker_received=epoch.get("worker_received"),
        fresh_epoch=bool(epoch.get("fresh", False)),
    )
