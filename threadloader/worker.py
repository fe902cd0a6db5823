"""Worker info and per-worker randomness for worker threads.

Each worker thread gets torch's own ``WorkerInfo`` (``worker_method="thread"``)
in a thread-local slot (``seed = base_seed + worker_id`` as in DataLoader), and
its own generators seeded exactly as ``torch``'s ``_worker_loop`` seeds a worker
process: ``random.Random(seed)``, a ``torch.Generator`` seeded with ``seed`` and
a legacy NumPy ``RandomState`` seeded with ``_generate_state(base_seed, id)``.
While the thread is a worker, the *global* RNG API (``torch.manual_seed``,
``torch.rand``, ``random.random``, ``np.random.rand``...) acts on those
generators (see ``_rng``), so worker code behaves as in a worker process and the
training loop's RNG is never touched. ``info.rng`` holds the same generators
(``torch.random.thread_safe_generator()`` returns the worker's torch generator).
"""

from __future__ import annotations

import copy
import random
import types
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import ChainDataset, ConcatDataset, Dataset, IterableDataset, Subset

from . import _rng, _torch_compat

_torch_compat.install()
_rng.install()

#: ``torch.utils.data.get_worker_info`` itself (made thread-aware): the info of
#: the calling worker thread, or of the worker process, or None elsewhere.
get_worker_info = _torch_compat.TORCH_GET_WORKER_INFO


def enter_worker(worker_id: int, num_workers: int, base_seed: int, dataset: Any,
                 process_wide: bool = False) -> Any:
    """Make the calling thread worker ``worker_id`` and return its info.

    From here until :func:`leave_worker`, the thread's global RNG API acts on
    the worker's own generators, seeded as DataLoader seeds worker processes.

    Args:
        worker_id: 0 .. num_workers - 1.
        num_workers: the loader's ``num_workers``.
        base_seed: the seed the iterator drew from the loader's generator.
        dataset: the dataset the worker reads (its :func:`worker_dataset`).
        process_wide: the worker is the only one in its (child) process: its
            info is also the process's, and its draws come from the process's
            generators (seeded by :func:`seed_process`), so threads it starts
            see both, as in a DataLoader worker process.

    Returns:
        The ``WorkerInfo`` now returned by ``get_worker_info()`` in this thread.
    """
    gens = _rng.WorkerGenerators(base_seed, worker_id)
    if process_wide:
        # The process's generators, which seed_process seeded as this worker's:
        # the worker and the threads it starts draw from one stream, as in a
        # DataLoader worker process (own generators would give the helpers a
        # second copy of the worker's draws).
        rng = _torch_compat.make_rng(_rng.PY_SINGLETON, torch.default_generator, gens.numpy)
    else:
        rng = _torch_compat.make_rng(gens.random, gens.torch, gens.numpy)
    info = _torch_compat.make_worker_info(worker_id, num_workers, base_seed, dataset, rng)
    _torch_compat.set_thread_worker_info(info)
    if process_wide:
        _torch_compat.set_process_worker_info(info)
    else:
        _rng.enter(gens)
    return info


def seed_process(base_seed: int, worker_id: int) -> None:
    """Seed the process-wide generators as DataLoader seeds the process of worker ``worker_id``.

    For a ``worker_processes`` child, with its first worker's id: its worker
    threads draw from their own generators, but threads they start draw from
    the process's, which must not be the parent's unseeded copy in every child.
    """
    seed = base_seed + worker_id
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a dependency
        return
    np.random.seed(_torch_compat.numpy_seed_state(base_seed, worker_id))


def worker_dataset(dataset: Any) -> Any:
    """The worker's own shallow copy of ``dataset``, with its own copies of the generators it holds.

    A worker process works on its own copy of the dataset, so attributes a
    worker sets on it (a file handle opened lazily in ``__getitem__``, a worker
    id stored by ``worker_init_fn``) are that worker's alone. A shallow copy
    gives each thread the same: its own attribute namespace, while the data the
    dataset holds (arrays, tensors, lists, dicts) stays one shared object, never
    duplicated. A dataset that cannot be copied is shared as it is.

    Random generators the dataset holds as attributes (``random.Random``,
    NumPy ``Generator``/``RandomState``, ``torch.Generator``) are copied too:
    each worker process draws from its own copy of them, so the draws do not
    depend on how the workers interleave. The datasets inside torch's
    wrappers (``Subset``, what ``random_split`` returns; ``ConcatDataset``;
    ``ChainDataset``) get the same treatment. A generator held twice stays
    one object; one that cannot be copied stays shared.

    Args:
        dataset: the loader's dataset.

    Returns:
        The copy, or ``dataset`` itself when copying fails.
    """
    return _replicate(dataset, {}, depth=0)


#: How deep wrappers of wrappers are followed (a guard against cycles).
_MAX_WRAPPER_DEPTH = 8


def _replicate(dataset: Any, memo: dict[int, Any], depth: int) -> Any:
    try:
        replica = copy.copy(dataset)
    except Exception:  # noqa: BLE001 - an uncopyable dataset is shared, as before
        return dataset
    if replica is dataset:  # a __copy__ that returns self: never write into the user's object
        return dataset
    try:
        attrs = vars(replica)
    except TypeError:  # __slots__: nothing of its own to give each worker
        return replica
    # Asked once, not per attribute: a dataset may have very many of them.
    wrapper = depth < _MAX_WRAPPER_DEPTH and isinstance(replica, (Subset, ConcatDataset, ChainDataset))
    for name, value in list(attrs.items()):
        own = _own_generator(value, memo)
        if own is value and wrapper:
            own = _inner_datasets(replica, name, value, memo, depth)
        if own is not value:
            attrs[name] = own
    return replica


def _inner_datasets(wrapper: Any, name: str, value: Any, memo: dict[int, Any], depth: int) -> Any:
    """The worker's replicas of the datasets a torch wrapper holds in attribute ``name``, or ``value``."""
    if isinstance(wrapper, Subset) and name == "dataset" and isinstance(value, (Dataset, IterableDataset)):
        return _replica_of(value, memo, depth)
    if isinstance(wrapper, (ConcatDataset, ChainDataset)) and name == "datasets" and isinstance(value, (list, tuple)):
        return type(value)(_replica_of(d, memo, depth) for d in value)
    return value


def _replica_of(dataset: Any, memo: dict[int, Any], depth: int) -> Any:
    key = id(dataset)
    if key not in memo:  # a dataset wrapped twice stays one object in this worker
        memo[key] = _replicate(dataset, memo, depth + 1)
    return memo[key]


#: Attribute types that are never random generators (exact types, not subclasses).
_PLAIN_TYPES = frozenset({type(None), bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset,
                          torch.Tensor, np.ndarray})


def _own_generator(value: Any, memo: dict[int, Any]) -> Any:
    """A copy of ``value`` in its current state when it is a random generator, else ``value``.

    The process-wide generators (``torch.default_generator``, ``random``'s and
    NumPy's legacy singletons) are left as they are: they belong to the
    process, not to the dataset, and a worker process would not have a copy
    of the parent's either. So is a generator that cannot be copied (a
    ``random.SystemRandom``, which has no state; a subclass whose
    constructor needs arguments).
    """
    if type(value) in _PLAIN_TYPES:  # most attributes: answered before the slower isinstance checks
        return value
    if isinstance(value, torch.Generator):
        if value is torch.default_generator or value.device.type != "cpu":
            return value
        make: Callable[[Any], Any] = _torch_generator_copy
    elif isinstance(value, random.Random):
        if value is _rng.PY_SINGLETON or isinstance(value, random.SystemRandom):
            return value
        make = _random_copy
    elif _rng.is_numpy_generator(value):
        make = copy.deepcopy
    else:
        return value
    key = id(value)
    if key not in memo:
        try:
            memo[key] = make(value)
        except Exception:  # noqa: BLE001 - shared, as before, rather than a dead worker
            memo[key] = value
    return memo[key]


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


def leave_worker() -> None:
    """Clear the calling thread's worker info and give it the global RNG API back."""
    _rng.leave()
    info = _torch_compat.get_thread_worker_info()
    if info is not None and _torch_compat.process_worker_info() is info:
        _torch_compat.set_process_worker_info(None)
    _torch_compat.set_thread_worker_info(None)
