"""Each worker's own copy of the dataset, as a worker process has one.

A worker process works on its own copy of the dataset. A worker thread gets a
shallow copy (its own attribute namespace; the data the dataset holds stays
one shared object) in which every random generator the dataset reaches is the
worker's own copy, and so is each object on the way to one: a transform
pipeline (``dataset.transform``, a ``Compose`` holding transforms each holding
a ``RandomState``, as MONAI's do) is copied down to its generators, so the
draws do not depend on how threads interleave and a ``worker_init_fn`` that
reseeds them reseeds that worker's alone. What holds no generator is shared.
"""

from __future__ import annotations

import copy
import functools
import random
import types
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import ChainDataset, ConcatDataset, Dataset, IterableDataset, Subset

from . import _rng

__all__ = ["rebound", "worker_dataset"]

#: How deep wrappers of wrappers are followed (a guard against cycles).
_MAX_WRAPPER_DEPTH = 8

#: How deep below the dataset generators are looked for: a generator in a
#: transform in a ``Compose`` in a dataset is 4 levels down (the list is one;
#: an ``nn.Module``'s ``_modules`` dict is one more per module).
_MAX_DEPTH = 8

#: Containers with more items than this are data (file lists, caches), not a
#: pipeline: not searched.
_MAX_ITEMS = 64

#: Objects and containers searched per dataset copy, at most (bounds the cost
#: of a dataset with a large object graph: the rest is shared, as before).
_MAX_VISITS = 4096

#: Types that never hold a generator, nor lead to one (exact types, not subclasses).
_LEAF_TYPES = frozenset({type(None), bool, int, float, complex, str, bytes, bytearray, range, set, frozenset,
                         torch.Tensor, np.ndarray, np.dtype, torch.dtype, torch.device, types.ModuleType,
                         types.FunctionType, types.BuiltinFunctionType, type})


class _Search:
    """One dataset copy's search for generators: copies made so far (by id), and its budget."""

    __slots__ = ("copies", "visits", "active")

    def __init__(self) -> None:
        #: id -> the worker's version of that object (itself when it reaches no generator).
        self.copies: dict[int, Any] = {}
        self.visits = 0
        #: ids of the objects being searched (a reference back to one of them is a cycle).
        self.active: set[int] = set()


def worker_dataset(dataset: Any) -> Any:
    """The worker's own shallow copy of ``dataset``, with its own copies of the generators it reaches.

    Attributes a worker sets on its copy (a file handle opened lazily in
    ``__getitem__``, a worker id stored by ``worker_init_fn``) are that
    worker's alone; the data the dataset holds (arrays, tensors, long lists,
    dicts) stays one shared object, never duplicated. A dataset that cannot
    be copied is shared as it is.

    Random generators (``random.Random``, NumPy ``Generator``/``RandomState``,
    CPU ``torch.Generator``) the dataset holds, as attributes or inside the
    objects and short containers it holds (a transform pipeline), are copied
    in their current state, with the objects on the way to them: each worker
    process draws from its own copies. The datasets inside torch's wrappers
    (``Subset``, ``ConcatDataset``, ``ChainDataset``) get the same treatment.
    An object reached twice stays one object; one that cannot be copied
    stays shared.

    Args:
        dataset: the loader's dataset.

    Returns:
        The copy, or ``dataset`` itself when copying fails.
    """
    return _replicate(dataset, _Search(), depth=0)


def _replicate(dataset: Any, search: _Search, depth: int) -> Any:
    try:
        replica = copy.copy(dataset)
        attrs = _own_namespace(dataset, replica)
    except Exception:  # noqa: BLE001 - an uncopyable dataset is shared, as before
        return dataset
    if attrs is None:  # a __copy__ returning self or sharing its namespace, or __slots__: never write into the user's object
        return dataset if replica is dataset else replica
    # What refers back to the dataset (self.transform = self.augment) reaches the worker's copy.
    search.copies[id(dataset)] = replica
    # Asked once, not per attribute: a dataset may have very many of them.
    wrapper = depth < _MAX_WRAPPER_DEPTH and isinstance(replica, (Subset, ConcatDataset, ChainDataset))
    for name, value in list(attrs.items()):
        if type(value) in _LEAF_TYPES:  # most attributes: answered before any call
            continue
        try:
            own = _inner_datasets(replica, name, value, search, depth) if wrapper else value
            if own is value:
                own = _own(value, search, 1)
        except Exception:  # noqa: BLE001 - user code (__getattr__, __copy__, properties) failed: shared, as before
            continue
        if own is not value:
            attrs[name] = own
    return replica


def _own_namespace(original: Any, replica: Any) -> dict[str, Any] | None:
    """``replica``'s attribute dict when it is its own (not ``original``'s), else None."""
    if replica is original:
        return None
    attrs = _namespace(replica)
    # A __copy__ (or a proxy's __getattr__) may hand back the original's namespace.
    return None if attrs is None or attrs is _namespace(original) else attrs


def _namespace(value: Any) -> Any:
    """``vars(value)``, or None (no ``__dict__``, or one that is not a dict)."""
    try:
        attrs = vars(value)
    except TypeError:
        return None
    return attrs if isinstance(attrs, dict) else None


def _inner_datasets(wrapper: Any, name: str, value: Any, search: _Search, depth: int) -> Any:
    """The worker's replicas of the datasets a torch wrapper holds in attribute ``name``, or ``value``."""
    if isinstance(wrapper, Subset) and name == "dataset" and isinstance(value, (Dataset, IterableDataset)):
        return _replica_of(value, search, depth)
    if isinstance(wrapper, (ConcatDataset, ChainDataset)) and name == "datasets" and isinstance(value, (list, tuple)):
        return type(value)(_replica_of(d, search, depth) for d in value)
    return value


def _replica_of(dataset: Any, search: _Search, depth: int) -> Any:
    key = id(dataset)
    if key not in search.copies:  # a dataset wrapped twice stays one object in this worker
        search.copies[key] = _replicate(dataset, search, depth + 1)
    return search.copies[key]


def _own(value: Any, search: _Search, depth: int) -> Any:
    """``value``, or the worker's copy of it when it is, or leads to, a random generator."""
    if type(value) in _LEAF_TYPES:
        return value
    key = id(value)
    if key in search.copies:
        return search.copies[key]
    make = _generator_copier(value)
    if make is not None:
        try:
            own = make(value)
        except Exception:  # noqa: BLE001 - shared, as before, rather than a dead worker
            own = value
    elif depth > _MAX_DEPTH or search.visits >= _MAX_VISITS or key in search.active:
        return value  # too deep, over budget, or a cycle: shared (not remembered: reached elsewhere it may be searched)
    else:
        search.visits += 1
        search.active.add(key)
        try:
            own = _with_own_parts(value, search, depth)
        finally:
            search.active.discard(key)
    search.copies[key] = own
    return own


def _with_own_parts(value: Any, search: _Search, depth: int) -> Any:
    """``value``, or a copy of it whose parts leading to generators are the worker's own."""
    kind = type(value)
    if kind is list or isinstance(value, tuple):
        if len(value) > _MAX_ITEMS:
            return value
        items = [_own(item, search, depth + 1) for item in value]
        if all(a is b for a, b in zip(items, value)):
            return value
        if kind is list or kind is tuple:
            return items if kind is list else tuple(items)
        make = getattr(kind, "_make", None)  # a namedtuple; other tuple subclasses stay shared
        return make(items) if make is not None else value
    if isinstance(value, dict) and (kind is dict or _namespace(value) in (None, {})):
        # dict, OrderedDict, defaultdict (their state is their items)
        if len(value) > _MAX_ITEMS:
            return value
        changed = {k: own for k, v in list(value.items()) if (own := _own(v, search, depth + 1)) is not v}
        if not changed:
            return value
        if kind is dict:
            return {**value, **changed}
        replica = copy.copy(value)
        replica.update(changed)
        return replica
    if kind is functools.partial:  # transform=partial(augment, rng=rng)
        parts = [value.func, *value.args, *value.keywords.values()]
        owns = [_own(part, search, depth + 1) for part in parts]
        if all(a is b for a, b in zip(owns, parts)):
            return value
        n = 1 + len(value.args)
        return functools.partial(owns[0], *owns[1:n], **dict(zip(value.keywords, owns[n:])))
    if kind is types.MethodType:  # transform=augmenter.apply: the method of the worker's augmenter
        owner = _own(value.__self__, search, depth + 1)
        return value if owner is value.__self__ else types.MethodType(value.__func__, owner)
    attrs = _namespace(value)
    if attrs is None or len(attrs) > _MAX_ITEMS:  # no __dict__ (C types, __slots__), or data: not searched
        return value
    changed = {k: own for k, v in list(attrs.items()) if (own := _own(v, search, depth + 1)) is not v}
    if not changed:
        return value
    try:
        replica = copy.copy(value)
        own_attrs = _own_namespace(value, replica)
    except Exception:  # noqa: BLE001 - uncopyable: its generators stay shared
        return value
    if own_attrs is None:
        return value
    own_attrs.update(changed)
    return replica


def _generator_copier(value: Any) -> Callable[[Any], Any] | None:
    """How to copy ``value`` in its current state when it is a random generator of its own, else None.

    The process-wide generators (``torch.default_generator``, ``random``'s and
    NumPy's legacy singletons) are left as they are: they belong to the
    process, not to the dataset, and a worker process would not have a copy
    of the parent's either. So is a generator that cannot be copied (a
    ``random.SystemRandom``, which has no state; a CUDA generator).
    """
    if isinstance(value, torch.Generator):
        if value is torch.default_generator or value.device.type != "cpu":
            return None
        return _torch_generator_copy
    if isinstance(value, random.Random):
        if value is _rng.PY_SINGLETON or isinstance(value, random.SystemRandom):
            return None
        return _random_copy
    if _rng.is_numpy_generator(value):
        return copy.deepcopy
    return None


def _torch_generator_copy(value: torch.Generator) -> torch.Generator:
    own = torch.Generator()
    own.set_state(value.get_state())
    return own


def _random_copy(value: random.Random) -> random.Random:
    """A deep copy; for a subclass whose constructor needs arguments (deepcopy calls it bare), one made from its state."""
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001 - a failure of this one too leaves the generator shared
        own = type(value).__new__(type(value))
        own.__dict__.update(getattr(value, "__dict__", {}))
        own.setstate(value.getstate())
        return own


def rebound(fn: Callable | None, original: Any, replica: Any) -> Callable | None:
    """``fn`` bound to ``replica`` when it is a method bound to ``original``, else ``fn``.

    ``worker_init_fn=dataset.init`` or ``collate_fn=dataset.collate`` act, in
    a worker process, on that process's copy of the dataset; in a worker
    thread they must act on the thread's copy.
    """
    # A bound method only: any other callable's attributes are not ours to probe
    # (a callable object's __getattr__ may raise for names it does not know).
    if replica is not original and isinstance(fn, types.MethodType) and fn.__self__ is original:
        return types.MethodType(fn.__func__, replica)
    return fn
