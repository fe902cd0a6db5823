"""The state dict's format: what ``state_dict()`` holds, how a loaded one is checked and planned.

A state dict holds plain Python values only (generator states as base64
strings): ``json.dumps`` and ``torch.save(..., weights_only=True)`` both
write it. The samplers' and datasets' own ``state_dict()`` values go in as
they return them. A malformed state, or a mid-epoch position of a loader
built differently, is one ValueError, raised before anything is restored.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import torch
from torch.utils.data import IterableDataset

from .epoch import EpochStart, ResumePlan, draws_from_global_rng
from .rngstate import decode_rng_state, encode_rng_state
from .states import CheckpointUnavailable, _has_state

__all__ = ["STATE_VERSION", "check_state", "loader_shape", "make_state", "plan_from_state", "unavailable_state"]

#: The state dict's version: 2 holds generator states as base64 strings. Version 1 held tensors;
#: it is refused (no release wrote it).
STATE_VERSION = 2


def make_state(loader: Any, progress: dict[str, Any] | None, persistent_base_seed: int | None = None,
               worker_states: list[Any] | None = None) -> dict[str, Any]:
    """The loader's state dict.

    Args:
        loader: the ThreadDataLoader.
        progress: the live iterator's epoch record and received tasks, or None
            between epochs.
        persistent_base_seed: between epochs, the base seed of the loader's
            persistent iterator (its next epoch draws none), else None.
        worker_states: between epochs, the states of persistent workers'
            dataset copies, which the next epoch goes on from (by worker), else None.
    """
    state = {
        "version": STATE_VERSION,
        "loader": loader_shape(loader),
        "epoch": progress,
        # Later epochs shuffle from the global RNG when there is no generator
        # (or a sampler draws from it all the same).
        "global_rng_state": encode_rng_state(torch.get_rng_state()) if draws_from_global_rng(loader) else None,
        "generator_state": (encode_rng_state(loader.generator.get_state())
                            if loader.generator is not None and progress is None else None),
    }
    if progress is None:
        # What the next epoch starts from besides the loader's RNG: samplers'
        # own generators and states, the IterableDataset's state, and a
        # persistent iterator's base seed.
        start = EpochStart.capture(loader, persistent_base_seed or 0)
        start.worker_states = worker_states
        start.check()
        state["next_epoch"] = {"start": start.to_record(), "persistent": persistent_base_seed is not None}
    return state


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
    if isinstance(loader.dataset, IterableDataset) or _has_state(loader.dataset):
        # Each worker's replica has its own position, each copy its own state.
        shape["num_workers"] = loader.num_workers
    else:
        try:
            shape["batches"] = len(loader)  # map-style: the batch sampler's length
        except Exception:  # noqa: BLE001 - a sampler without a usable len(): no length to check
            # (TypeError: none; NotImplementedError: declined; ValueError: a
            # negative one, as Accelerate's skip sampler has past the end.)
            pass
    return shape


def _bad(what: str) -> ValueError:
    return ValueError(f"not a valid ThreadDataLoader state dict: {what}")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_rng_state(value: Any, name: str) -> None:
    if not isinstance(value, str):
        raise _bad(f"{name} is not a CPU generator state (a base64 string)")
    try:
        decode_rng_state(value)
    except ValueError as e:
        raise _bad(f"{name} is not a CPU generator state: {e}") from None


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
    generators = start.get("sampler_generators", {})
    if not isinstance(generators, dict):
        raise _bad(f"{name}.sampler_generators is not a dict")
    for key, value in generators.items():
        _check_rng_state(value, f"{name}.sampler_generators[{key!r}]")
    if start.get("global_rng_state") is not None:
        _check_rng_state(start["global_rng_state"], f"{name}.global_rng_state")
    if not isinstance(start.get("worker_states"), (list, type(None))):
        raise _bad(f"{name}.worker_states is not a list or None")


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
    for key in ("worker_states", "iter_states", "resume_states"):
        if not isinstance(epoch.get(key), (list, type(None))):
            raise _bad(f"epoch.{key} is not a list or None")


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
        torch.set_rng_state(decode_rng_state(state["global_rng_state"]))
    if state.get("generator_state") is not None and loader.generator is not None:
        loader.generator.set_state(decode_rng_state(state["generator_state"]))
    epoch = state["epoch"]
    if epoch is None:
        upcoming = state.get("next_epoch")
        if upcoming is None:
            return None
        start = EpochStart.from_record(upcoming["start"])
        if upcoming["persistent"] and loader.persistent_workers and loader.num_workers > 0:
            # The uninterrupted run's persistent iterator draws no base seed for
            # its next epoch: the new one takes the old one's and starts from here.
            return ResumePlan(start=start, consumed_prefix=0, consumed_extra=[], num_yielded=0, fresh_epoch=True,
                              worker_states=start.worker_states)
        start.apply_to_objects(loader)
        return None
    start = EpochStart.from_record(epoch["start"])
    recorded = epoch.get("worker_states")
    return ResumePlan(
        start=start,
        consumed_prefix=epoch["consumed_prefix"],
        consumed_extra=list(epoch["consumed_extra"]),
        num_yielded=epoch["num_yielded"],
        worker_received=epoch.get("worker_received"),
        fresh_epoch=bool(epoch.get("fresh", False)),
        worker_states=recorded if recorded is not None else start.worker_states,
        recorded_states=recorded,
        iter_states=epoch.get("iter_states"),
        resume_states=epoch.get("resume_states"),
    )
