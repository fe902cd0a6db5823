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
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

import torch
from torch.utils.data import IterableDataset

STATE_VERSION = 1


def _sampler_objects(loader: Any) -> dict[str, Any]:
    """The sampler-like objects of a loader whose state decides an epoch's order."""
    objs = {"sampler": loader.sampler, "batch_sampler": loader.batch_sampler}
    inner = getattr(loader.batch_sampler, "sampler", None)
    if inner is not None and inner is not loader.sampler:
        objs["batch_sampler.sampler"] = inner
    return {k: v for k, v in objs.items() if v is not None}


def _has_state(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def _epoch_of(obj: Any) -> int | None:
    """The epoch of a sampler driven by ``set_epoch`` (DistributedSampler and alike), else None."""
    epoch = getattr(obj, "epoch", None)
    if isinstance(epoch, int) and not isinstance(epoch, bool) and callable(getattr(obj, "set_epoch", None)):
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

    @classmethod
    def capture(cls, loader: Any, base_seed: int) -> "EpochStart":
        gen = loader.generator
        rng_state = gen.get_state() if gen is not None else torch.get_rng_state()
        sampler_generators, sampler_states, sampler_epochs = {}, {}, {}
        for name, obj in _sampler_objects(loader).items():
            epoch = _epoch_of(obj)
            if epoch is not None:
                sampler_epochs[name] = epoch
            own = getattr(obj, "generator", None)
            if isinstance(own, torch.Generator) and own is not gen:
                sampler_generators[name] = own.get_state()
            if _has_state(obj):
                sampler_states[name] = _state_of(obj, name)
        dataset_state = None
        if isinstance(loader.dataset, IterableDataset) and _has_state(loader.dataset):
            dataset_state = _state_of(loader.dataset, "dataset")
        return cls(int(base_seed), rng_state, sampler_generators, sampler_states, dataset_state, sampler_epochs)

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
        else:
            torch.set_rng_state(self.rng_state)
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

    def skips(self, task: int) -> bool:
        return task < self.consumed_prefix or task in self._extra

    def __post_init__(self) -> None:
        self._extra = frozenset(self.consumed_extra)


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

    def __del__(self) -> None:
        box = self.progress_box
        if box is None or sys.is_finalizing():  # no checkpoint is taken after exit; torch may be torn down
            return
        try:
            box.record = self.progress()  # type: ignore[attr-defined]
        except CheckpointUnavailable as e:
            box.record, box.error = None, e
        except Exception:  # noqa: BLE001 - a half-built iterator, or interpreter exit
            box.record = None


@contextlib.contextmanager
def isolated_rng(loader: Any) -> Iterator[None]:
    """Replay an epoch start without moving the global RNG the user sees.

    With a loader ``generator`` the replay moves only that generator, exactly
    as the interrupted run moved it. Without one, the epoch's draws come from
    torch's global RNG; they are replayed on a saved copy and the global state
    is put back afterwards.
    """
    if loader.generator is not None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        yield


def make_state(loader: Any, progress: dict[str, Any] | None) -> dict[str, Any]:
    """The loader's state dict.

    Args:
        loader: the ThreadDataLoader.
        progress: the live iterator's epoch record and received tasks, or None
            between epochs.
    """
    return {
        "version": STATE_VERSION,
        "epoch": progress,
        # Later epochs shuffle from the global RNG when there is no generator.
        "global_rng_state": torch.get_rng_state() if loader.generator is None else None,
        "generator_state": loader.generator.get_state() if loader.generator is not None and progress is None else None,
    }


def progress_record(start: EpochStart, prefix: int, extra: list[int], num_yielded: int) -> dict[str, Any]:
    start.check()
    return {
        "start": asdict(start),
        "consumed_prefix": int(prefix),
        "consumed_extra": sorted(int(i) for i in extra),
        "num_yielded": int(num_yielded),
    }


def plan_from_state(loader: Any, state: dict[str, Any]) -> ResumePlan | None:
    """Validate a state dict, restore its between-epoch RNG state, and plan the resume.

    Raises:
        ValueError: the dict is not a threadloader state of a known version.
    """
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION or "epoch" not in state:
        raise ValueError(
            f"not a ThreadDataLoader state dict of version {STATE_VERSION}: "
            f"{sorted(state) if isinstance(state, dict) else type(state).__name__}"
        )
    if state.get("global_rng_state") is not None:
        torch.set_rng_state(state["global_rng_state"])
    if state.get("generator_state") is not None and loader.generator is not None:
        loader.generator.set_state(state["generator_state"])
    epoch = state["epoch"]
    if epoch is None:
        return None
    return ResumePlan(
        start=EpochStart(**epoch["start"]),
        consumed_prefix=epoch["consumed_prefix"],
        consumed_extra=list(epoch["consumed_extra"]),
        num_yielded=epoch["num_yielded"],
    )
