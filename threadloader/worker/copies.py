"""Each worker's own copy of the dataset and of its hooks, as a worker process has one.

A worker process works on its own copy of the dataset, ``collate_fn`` and
``worker_init_fn`` (forked, or unpickled together). A worker thread gets a
shallow copy of the dataset: its own attribute namespace, while the data the
dataset holds stays one shared object. In that copy, every random generator
the dataset or the hooks reach is the worker's own copy, and so is each object
on the way to one. So a transform pipeline (``dataset.transform``, a
``Compose`` holding transforms each holding a ``RandomState``, as MONAI's do)
is copied down to its generators. The draws then do not depend on how threads
interleave, and a ``worker_init_fn`` that reseeds them reseeds that worker's
alone. What leads to
the dataset (``functools.partial(reseed, dataset=ds)`` as ``worker_init_fn``)
is copied the same way, so it reaches the worker's copy. What leads to neither
is shared. An IterableDataset is deep-copied instead, its data aside (see
:func:`_iterates_its_own_state`), and a DataPipe graph whole.

The copy is made in two passes. The first walks what the dataset and hooks
reach, breadth first (a transform one attribute down is found before the
records of a long annotation list), within a budget, and notes which objects
lead to a generator or to the dataset. The second copies those objects only,
each one before its parts, so that a part referring back to it (``t.parent =
compose``) reaches the copy.
"""

from __future__ import annotations

import collections
import copy
import functools
import gc
import random
import sys
import traceback
import types
import weakref
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np
import torch
from torch.utils.data import ChainDataset, ConcatDataset, IterableDataset, Subset

from . import rng as _rng
from .datapipes import is_datapipe, worker_copy

__all__ = ["WorkerParts", "retire", "worker_dataset", "worker_parts"]

#: How many steps below a root generators are looked for: a generator in a
#: transform in a ``OneOf`` in a ``Compose`` in an adapter in a dataset is 10
#: down (every list is one; an ``nn.Module``'s ``_modules`` dict one more per module).
_MAX_DEPTH = 32

#: Containers with more items than this are data (file lists, caches), not a
#: pipeline: not searched.
_MAX_ITEMS = 64

#: Objects and containers searched per copy, at most (bounds the cost of a
#: dataset with a large object graph: what lies beyond is shared).
_MAX_VISITS = 4096
#: Objects (atoms aside) an IterableDataset may reach and still be deep-copied per worker.
_MAX_DEEP_OBJECTS = 100_000

#: Types that never hold a generator, nor lead to one (exact types, not subclasses).
_LEAF_TYPES = frozenset({type(None), bool, int, float, complex, str, bytes, bytearray, range, set, frozenset,
                         torch.Tensor, np.ndarray, np.dtype, torch.dtype, torch.device, types.ModuleType,
                         types.CodeType, type})

class WorkerParts(NamedTuple):
    """What one worker works on: its dataset and hooks (see :func:`worker_parts`)."""

    dataset: Any
    init_fn: Callable | None
    collate_fn: Callable | None
    #: (copy, original) for the copies whose class has a ``__del__`` (see :func:`retire`).
    finalized: tuple[tuple[Any, Any], ...] = ()


def worker_parts(dataset: Any, init_fn: Callable | None, collate_fn: Callable | None) -> WorkerParts:
    """The worker's own copies of ``dataset`` and, where they need one, of its hooks.

    A map-style dataset is always copied, shallowly: attributes a worker sets on its
    copy (a file handle opened lazily in ``__getitem__``, a worker id stored by
    ``worker_init_fn``) are that worker's alone; the data it holds (arrays,
    tensors, long lists, dicts) stays one shared object, never duplicated. A
    dataset that cannot be copied is shared as it is. The datasets inside
    torch's wrappers (``Subset``, ``ConcatDataset``, ``ChainDataset``) are
    copied the same way. An IterableDataset is deep-copied, its data shared
    (:func:`_deep_copy_sharing_data`): iterating moves state it holds.

    Random generators (``random.Random``, NumPy ``Generator``/``RandomState``,
    CPU ``torch.Generator``) the dataset or a hook reaches are copied in their
    current state, with the objects on the way to them; so is what leads from a
    hook to the dataset (a bound method of it, a partial or closure holding it),
    which then reaches the worker's copy. The search follows attributes (also
    ``__slots__``), lists, tuples, namedtuples, deques and dicts of up to
    :data:`_MAX_ITEMS` items, bound methods, ``functools.partial``, and
    functions' closures, defaults and the module globals they name. An object
    reached twice stays one object; one that cannot be copied stays shared.

    Args:
        dataset: the loader's dataset.
        init_fn: its ``worker_init_fn``.
        collate_fn: its ``collate_fn``.

    Returns:
        The worker's dataset, ``worker_init_fn`` and ``collate_fn``.
    """
    walk = _Walk()
    walk.run([dataset, init_fn, collate_fn], dataset)
    build = _Build(walk.leads(), walk.datasets)
    return WorkerParts(build.own(dataset), build.own(init_fn), build.own(collate_fn), tuple(build.finalized))


def worker_dataset(dataset: Any) -> Any:
    """The worker's own shallow copy of ``dataset`` (:func:`worker_parts` without hooks)."""
    return worker_parts(dataset, None, None).dataset


def retire(parts: WorkerParts) -> None:
    """Finalize a worker's copies as a worker process's exit would, without touching what they share.

    A copy shares its attributes with the original: its class's ``__del__``
    run as usual on collection would close the *original's* file handle (a
    dataset opening one in ``__init__`` and closing it in ``__del__`` then
    fails in its next epoch, and in the loader's process). Called once the
    worker thread has stopped: each copy's ``__del__`` runs now, with the
    attributes it shares with the original hidden (it closes what the worker
    opened, as in a process; a shared one raises AttributeError there,
    ignored), and is not run again on collection.
    """
    for replica, original in parts.finalized:
        _finalize_copy(replica, original)


def _finalize_copy(replica: Any, original: Any) -> None:
    kind = type(replica)
    attrs, shared_with = _namespace(replica), _namespace(original) or {}
    if attrs is not None:
        for name in [n for n, v in attrs.items() if type(v) not in _LEAF_TYPES and shared_with.get(n) is v]:
            del attrs[name]
    try:
        kind.__del__(replica)
    except AttributeError:  # a shared attribute it would have closed: the original's to close
        pass
    except Exception:  # noqa: BLE001 - reported as Python reports a failing __del__, never raised
        print(f"Exception ignored in: {kind.__del__!r} (a worker thread's copy)", file=sys.stderr)
        traceback.print_exc()
    try:
        replica.__class__ = _without_finalizer(kind)
    except Exception:  # noqa: BLE001 - a class that cannot be subclassed or swapped: collection runs its __del__ once more
        pass


@functools.lru_cache(maxsize=256)
def _without_finalizer(kind: type) -> type:
    """``kind`` with a ``__del__`` that does nothing (same layout: ``__class__`` can be swapped)."""
    return type(kind.__name__, (kind,), {"__slots__": (), "__del__": _finalized, "__module__": kind.__module__,
                                          "__qualname__": kind.__qualname__})


def _finalized(self: Any) -> None:
    """A copy's ``__del__`` after :func:`retire` ran it."""


# --- first pass: what leads where ---------------------------------------------------------


class _Walk:
    """Breadth-first walk from the roots: which objects lead to a generator or to a dataset."""

    def __init__(self) -> None:
        #: id -> object, for everything met (keeps them alive while ids are compared).
        self.seen: dict[int, Any] = {}
        #: id -> ids of the objects holding it.
        self.holders: dict[int, list[int]] = collections.defaultdict(list)
        #: ids of the generators and datasets met: what makes its holders copied.
        self.targets: set[int] = set()
        #: ids of the datasets (always copied, each with its own namespace).
        self.datasets: set[int] = set()

    def run(self, roots: list[Any], dataset: Any) -> None:
        self.datasets.add(id(dataset))
        self.targets.add(id(dataset))
        # (object, depth, reached through a function's globals)
        queue = collections.deque((root, 0, False) for root in roots if type(root) not in _LEAF_TYPES)
        visits = 0
        while queue:
            value, depth, via_globals = queue.popleft()
            key = id(value)
            if key in self.seen:
                continue
            self.seen[key] = value
            if _generator_copier(value) is not None:
                self.targets.add(key)
                continue
            is_dataset = key in self.datasets
            if not is_dataset and (depth >= _MAX_DEPTH or visits >= _MAX_VISITS):
                continue  # beyond the budget: shared
            visits += 1
            try:
                parts, named_globals = _parts(value, via_globals)
                if is_dataset:
                    inner = [id(d) for d in _inner_datasets(value)]
                    self.datasets.update(inner)
                    self.targets.update(inner)
            except Exception:  # noqa: BLE001 - user code (__getattr__, properties) failed: shared, as before
                continue
            for through_globals, found in ((via_globals, parts), (True, named_globals)):
                for part in found:
                    self.holders[id(part)].append(key)
                    if id(part) not in self.seen:
                        queue.append((part, depth + 1, through_globals))

    def leads(self) -> dict[int, Any]:
        """id -> object, for every object met that leads to a target (targets included)."""
        found: dict[int, Any] = {}
        stack = [key for key in self.targets if key in self.seen]
        while stack:
            key = stack.pop()
            if key in found:
                continue
            found[key] = self.seen[key]
            stack.extend(h for h in self.holders.get(key, ()) if h not in found)
        return found  # the datasets among them: they are targets, copied whether or not anything leads on


def _iterates_its_own_state(dataset: Any) -> bool:
    """Whether a worker needs a deep copy of ``dataset``: an IterableDataset.

    A worker process iterates its own copy of everything an IterableDataset
    holds, and iteration often moves state kept below the dataset's own
    attributes: webdataset's ``detshuffle`` stage and ``ResampledShards`` count
    epochs in an object of the pipeline, Hugging Face's ``IterableDataset``
    records its progress in its examples iterable. In a shallow copy every
    worker thread would advance the one shared object (and the loader's
    dataset with it). A map-style dataset is only read: it keeps the shallow
    copy, its data shared.
    """
    return isinstance(dataset, IterableDataset)


#: What deepcopy keeps as it is (and so what it does not look into).
_NOT_DEEP_COPIED = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.CodeType,
                    weakref.ref, property, str, bytes, int, float, complex, bool, type(None), range)


#: Containers deepcopy copies itself, item by item.
_DEEP_COPIED_ITEMWISE = (list, tuple, dict, set, frozenset)


def _deep_copyable(value: Any) -> bool:
    """Whether deepcopy can copy ``value`` itself (its parts aside): it has ``__deepcopy__`` or reduces."""
    kind = type(value)
    if kind in _DEEP_COPIED_ITEMWISE or hasattr(kind, "__deepcopy__"):
        return True
    try:
        value.__reduce_ex__(4)  # what deepcopy calls; refused by locks, files, generators
    except Exception:  # noqa: BLE001 - any refusal: the object is shared, not copied
        return False
    return True


def _is_data(value: Any) -> bool:
    """Tensors, arrays, and containers of more than :data:`_MAX_ITEMS` items (file lists, caches)."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return True
    return isinstance(value, (list, tuple, dict, set, frozenset, collections.deque)) and len(value) > _MAX_ITEMS


def _deep_copy_sharing_data(dataset: Any, copies: dict[int, Any]) -> Any:
    """A deep copy of ``dataset`` in which its data stays the original's; None if it cannot be made.

    ``copies`` (id -> the worker's version) gains every object copied, so that
    a hook holding a part of the dataset (``functools.partial(reseed,
    transform=ds.transform)``) gets the part inside the worker's copy, as in
    a worker process.

    A worker process has a copy of everything; here the data (:func:`_is_data`)
    is shared as with every other dataset, so memory does not grow with
    workers, and tensors keep working as shared state (Hugging Face's epoch
    counter is one in shared memory, written by ``set_epoch`` for persistent
    workers to read). So is what deepcopy cannot copy (a lock, an open file, a
    database handle): the workers share it, as they share everything in the
    shallow copy. Anything else it refuses leaves the dataset to the shallow copy.
    """
    memo: dict[int, Any] = {}
    seen = {id(dataset)}
    stack = [dataset]
    while stack and len(seen) < _MAX_DEEP_OBJECTS:
        for part in gc.get_referents(stack.pop()):
            if id(part) in seen or isinstance(part, _NOT_DEEP_COPIED):
                continue
            seen.add(id(part))
            if _is_data(part) or not _deep_copyable(part):
                memo[id(part)] = part  # deepcopy takes it as already copied: shared
            else:
                stack.append(part)
    if stack:
        return None  # beyond the budget: too big to copy per worker
    shared = set(memo)
    try:
        replica = copy.deepcopy(dataset, memo)
    except Exception:  # noqa: BLE001 - an object deepcopy refuses: the shallow copy, as before
        return None
    memo.pop(id(memo), None)  # deepcopy's own list of what it keeps alive
    copies.update((key, value) for key, value in memo.items() if key not in shared)
    return replica


def _inner_datasets(dataset: Any) -> list[Any]:
    """The datasets inside one of torch's wrappers (none for any other dataset)."""
    if isinstance(dataset, Subset):
        return [dataset.dataset]
    if isinstance(dataset, (ConcatDataset, ChainDataset)) and isinstance(dataset.datasets, (list, tuple)):
        return list(dataset.datasets)  # a ChainDataset may hold a one-shot iterable: not consumed here
    return []


def _is_mapping_of_items(value: Any) -> bool:
    """dict, OrderedDict, defaultdict...: a dict whose state is its items (no attributes of its own)."""
    return isinstance(value, dict) and (type(value) is dict or _namespace(value) in (None, {}))


def _parts(value: Any, via_globals: bool) -> tuple[list[Any], list[Any]]:
    """What ``value`` holds that the search follows (leaves left out), and the module globals it names."""
    kind = type(value)
    if kind is list or kind is collections.deque or isinstance(value, tuple):
        return (_searched(value) if len(value) <= _MAX_ITEMS else []), []
    if _is_mapping_of_items(value):
        return (_searched(list(value.values())) if len(value) <= _MAX_ITEMS else []), []
    if kind is functools.partial:  # transform=partial(augment, rng=rng)
        return _searched([value.func, *value.args, *list(value.keywords.values())]), []
    if kind is types.MethodType:  # transform=augmenter.apply: the method of the worker's augmenter
        return _searched([value.__self__, value.__func__]), []
    if kind is types.BuiltinMethodType:  # transform=rng.random: the worker's generator's method
        owner = getattr(value, "__self__", None)
        return ([owner] if owner is not None and type(owner) not in _LEAF_TYPES else []), []
    if kind is types.FunctionType:
        return _function_parts(value, via_globals)
    parts = []
    attrs = _namespace(value)
    if attrs is not None:
        parts = _searched(list(attrs.values()))  # one pass in C: a dataset may have very many attributes
        parts.extend(item for _, item in _class_generators(kind, attrs))
    for name in _slot_names(kind):
        try:
            parts.append(getattr(value, name))
        except AttributeError:  # an unset slot
            pass
    return parts, []


def _searched(items: list[Any] | tuple[Any, ...] | collections.deque) -> list[Any]:
    return [item for item in items if type(item) not in _LEAF_TYPES]


def _function_parts(fn: types.FunctionType, via_globals: bool) -> tuple[list[Any], list[Any]]:
    """A function's closure and defaults and, unless reached through globals itself, the globals it names.

    Globals are followed one function deep: a lambda naming a module-level
    pipeline is searched, the library functions that pipeline's functions
    name are not (they would lead through whole libraries).
    """
    parts = []
    for cell in fn.__closure__ or ():
        try:
            parts.append(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    parts.extend(fn.__defaults__ or ())
    parts.extend(list((fn.__kwdefaults__ or {}).values()))
    if via_globals:
        return _searched(parts), []
    namespace = fn.__globals__
    return _searched(parts), _searched([namespace[n] for n in _global_names(fn.__code__) if n in namespace])


def _global_names(code: types.CodeType) -> set[str]:
    """The names ``code`` and the functions defined in it may look up as globals."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _namespace(value: Any) -> Any:
    """``vars(value)``, or None (no ``__dict__``, or one that is not a dict)."""
    try:
        attrs = vars(value)
    except TypeError:
        return None
    return attrs if isinstance(attrs, dict) else None


def _class_generators(kind: type, attrs: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """The generators an instance reads from its class (``rng = default_rng(0)`` in the class body).

    A worker process has its own copy of the class and so of them; a worker
    thread's copy of the instance gets its own in its namespace, shadowing
    the class's (``self.rng`` then reads the worker's).
    """
    for name in _class_generator_names(kind):
        if name in attrs:
            continue
        for cls in kind.__mro__:
            if name in cls.__dict__:
                yield name, cls.__dict__[name]
                break


@functools.lru_cache(maxsize=1024)
def _class_generator_names(kind: type) -> tuple[str, ...]:
    return tuple(sorted({name for cls in kind.__mro__ if cls is not object
                         for name, value in list(cls.__dict__.items()) if _generator_copier(value) is not None}))


@functools.lru_cache(maxsize=1024)
def _slot_names(kind: type) -> tuple[str, ...]:
    """The instance slots a class and its bases declare (private names mangled), ``__dict__`` aside."""
    names: list[str] = []
    for cls in kind.__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name in ("__dict__", "__weakref__"):
                continue
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{cls.__name__.lstrip('_')}{name}"
            names.append(name)
    return tuple(names)


# --- second pass: the copies -------------------------------------------------------------


class _Build:
    """The worker's version of each object met: its copy when it leads somewhere, else itself."""

    def __init__(self, leads: dict[int, Any], datasets: set[int]) -> None:
        #: id -> object, for what leads to a generator or a dataset (only these are copied).
        self.leads = leads
        self.datasets = datasets
        #: id -> the worker's version (an object under construction is there already).
        self.copies: dict[int, Any] = {}
        #: ids of the objects whose copy is made after its parts (tuples, partials): a cycle back to one shares it.
        self.building: set[int] = set()
        #: (copy, original) for copies whose class has a ``__del__``.
        self.finalized: list[tuple[Any, Any]] = []

    def own(self, value: Any) -> Any:
        key = id(value)
        if key in self.copies:
            return self.copies[key]
        if key not in self.leads or key in self.building:
            return value
        make = _generator_copier(value)
        try:
            if make is not None:
                own = make(value)
            elif key in self.datasets and is_datapipe(value):
                own = worker_copy(value)  # its pipes are shard and iterator state: all the worker's
            elif key in self.datasets and _iterates_its_own_state(value):
                own = _deep_copy_sharing_data(value, self.copies)
                if own is None:
                    own = self._object(value, dataset=True)
            elif key in self.datasets:
                own = self._object(value, dataset=True)
            else:
                own = self._with_own_parts(value)
        except Exception:  # noqa: BLE001 - user code (__copy__, __getattr__) failed: shared, as before
            own = value
        self.copies[key] = own
        return own

    def _with_own_parts(self, value: Any) -> Any:
        key = id(value)
        kind = type(value)
        if kind is list:
            replica = list(value)
            self.copies[key] = replica  # before the parts: a cycle back here reaches the copy
            replica[:] = [self.own(item) for item in value]
            return replica
        if kind is collections.deque:
            replica = collections.deque(maxlen=value.maxlen)
            self.copies[key] = replica
            replica.extend(self.own(item) for item in list(value))
            return replica
        if _is_mapping_of_items(value):
            replica = dict(value) if kind is dict else copy.copy(value)
            self.copies[key] = replica
            for k, v in list(value.items()):
                if (own := self.own(v)) is not v:
                    replica[k] = own
            return replica
        if kind is types.FunctionType:
            return self._function(value)
        if kind is types.BuiltinMethodType:
            return getattr(self.own(value.__self__), value.__name__)
        if isinstance(value, tuple) or kind in (functools.partial, types.MethodType):
            self.building.add(key)
            try:
                return self._rebuilt(value)
            finally:
                self.building.discard(key)
        return self._object(value, dataset=False)

    def _rebuilt(self, value: Any) -> Any:
        """A tuple, partial or bound method made anew from the worker's versions of its parts."""
        kind = type(value)
        if isinstance(value, tuple):
            items = [self.own(item) for item in value]
            if kind is tuple:
                return tuple(items)
            make = getattr(kind, "_make", None)  # a namedtuple; other tuple subclasses stay shared
            return make(items) if make is not None else value
        if kind is functools.partial:
            kwargs = {k: self.own(v) for k, v in value.keywords.items()}
            return functools.partial(self.own(value.func), *(self.own(a) for a in value.args), **kwargs)
        return types.MethodType(self.own(value.__func__), self.own(value.__self__))

    def _object(self, value: Any, dataset: bool) -> Any:
        """A shallow copy of an object whose attributes (or slots) that lead somewhere are the worker's own."""
        key = id(value)
        replica = copy.copy(value)
        if replica is value:  # a __copy__ returning self: never write into the user's object
            return value
        attrs = _namespace(replica)
        if attrs is not None and attrs is _namespace(value):  # a __copy__ sharing the original's namespace
            return value
        self.copies[key] = replica  # before the attributes: what refers back reaches the copy
        if getattr(type(value), "__del__", None) is not None:
            self.finalized.append((replica, value))
        originals = _namespace(value) or {}
        if attrs is not None:
            for name, item in list(_class_generators(type(value), originals)):
                if (own := self.own(item)) is not item:
                    attrs[name] = own
        for name, item in list(originals.items()):
            if type(item) in _LEAF_TYPES:  # most attributes: answered before any call
                continue
            try:
                if (own := self.own(item)) is not item:
                    attrs[name] = own
            except Exception:  # noqa: BLE001 - a dataset's attribute failing: it stays shared
                if not dataset:
                    raise
        for name in _slot_names(type(value)):
            try:
                item = getattr(value, name)
            except AttributeError:
                continue
            if (own := self.own(item)) is not item:
                object.__setattr__(replica, name, own)  # frozen dataclasses too
        return replica

    def _function(self, fn: types.FunctionType) -> types.FunctionType:
        """``fn`` with the worker's versions of its closure, defaults and the globals it names."""
        key = id(fn)
        namespace = fn.__globals__
        names = [n for n in _global_names(fn.__code__) if n in namespace and id(namespace[n]) in self.leads]
        if names:
            # One copy of a module's namespace per worker, shared by its functions
            # copied (a process has one module): what they rebind there stays theirs.
            gkey = id(namespace)
            if gkey not in self.copies:  # (the module keeps its namespace, and so its id, alive)
                self.copies[gkey] = dict(namespace)
            namespace = self.copies[gkey]
        cells = tuple(types.CellType() for _ in fn.__closure__ or ())
        replica = types.FunctionType(fn.__code__, namespace, fn.__name__, None, cells or None)
        self.copies[key] = replica  # before its parts: a recursive function names itself
        for own_cell, cell in zip(cells, fn.__closure__ or ()):
            try:
                own_cell.cell_contents = self.own(cell.cell_contents)
            except ValueError:  # an empty cell stays empty
                pass
        replica.__defaults__ = tuple(self.own(d) for d in fn.__defaults__) if fn.__defaults__ else None
        replica.__kwdefaults__ = {k: self.own(v) for k, v in fn.__kwdefaults__.items()} if fn.__kwdefaults__ else None
        for name in names:
            namespace[name] = self.own(fn.__globals__[name])
        replica.__dict__.update(fn.__dict__)
        replica.__qualname__, replica.__doc__ = fn.__qualname__, fn.__doc__
        replica.__annotations__ = fn.__annotations__
        replica.__module__ = fn.__module__
        return replica


# --- generators -----------------------------------------------------------------------------


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
