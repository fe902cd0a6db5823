"""The samplers' and datasets' own state: which objects keep one, reading it, comparing it.

What a loader reads with ``state_dict()`` and restores with
``load_state_dict()`` besides random generators. A ``state_dict()`` that
raises is kept as the error, raised only when a checkpoint needs it:
DataLoader never calls it, so iterating must not fail because of it.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
from torch.utils.data import IterableDataset

__all__ = ["CheckpointUnavailable", "check_states", "dataset_has_state", "dataset_state_of", "same_state",
           "start_state_of"]

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


def dataset_has_state(dataset: Any) -> bool:
    """Whether a dataset keeps its own state for us (``state_dict()`` / ``load_state_dict``), map-style or iterable."""
    return _has_state(dataset)


def dataset_state_of(dataset: Any, owner: str = "dataset") -> Any:
    """The ``state_dict()`` of a dataset (a loader's, or a worker's copy of it) that has one; else None.

    One that raised is kept as the error, raised if a checkpoint needs it.
    """
    if _has_state(dataset):
        return _state_of(dataset, owner)
    return None


def start_state_of(dataset: Any) -> Any:
    """A dataset's state at an epoch's start, before ``__iter__``; None for an IterableDataset whose ``state_dict()`` raises.

    An IterableDataset may make its state in ``__iter__`` (StatefulDataLoader
    asks for it only after): before that it has none to restore, and the
    resume starts from a dataset that has none yet either.
    """
    if isinstance(dataset, IterableDataset) and _has_state(dataset):
        try:
            return _attr(dataset, "state_dict")()
        except Exception:  # noqa: BLE001 - no state before its first __iter__
            return None
    return dataset_state_of(dataset)


def same_state(a: Any, b: Any) -> bool:
    """Whether two ``state_dict()`` values are equal, tensors and arrays by value, lists and tuples alike (JSON)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and bool(torch.equal(a.cpu(), b.cpu())))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - arrays compare element-wise
        try:
            import numpy as np

            return bool(np.array_equal(a, b))
        except Exception:  # noqa: BLE001
            return False


def check_states(values: Any) -> None:
    """Raise CheckpointUnavailable for the first ``state_dict()`` among ``values`` that raised."""
    for value in values:
        if isinstance(value, _FailedState):
            raise CheckpointUnavailable(
                f"cannot checkpoint this epoch: {value.owner}.state_dict() raised: {value.error!r}") from value.error
