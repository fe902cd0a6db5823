"""DataPipe datasets in worker threads: what DataLoader's workers do to them.

DataLoader still serves ``torch.utils.data`` DataPipe graphs (``IterableWrapper
(...).shuffle().sharding_filter()``): each worker process gets its own copy of
the graph, seeds its random pipes with one seed shared by all workers (so they
shuffle alike, then each keeps its shard), and shards it in an extra
``worker_init_fn`` run before the user's. Worker threads do the same to their
own copy (:func:`threadloader._platform.torch_compat.datapipe_worker_copy`, made with the
worker's other copies in :mod:`threadloader.worker.copies`).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, ContextManager

import torch
import torch.distributed as dist
from torch.utils.data import IterDataPipe, MapDataPipe, get_worker_info
from torch.utils.data.graph_settings import apply_random_seed, apply_sharding

from .._platform.fork import renew_after_fork
from .._platform.torch_compat import datapipe_worker_copy

__all__ = ["graph_lock", "is_datapipe", "peek_shared_seed", "seed_graph", "sharding_init_fn", "worker_copy"]

# torch walks a DataPipe graph (apply_random_seed, apply_sharding) by pickling
# it with a hook set on the DataPipe *classes* for the walk's duration, and
# refuses to set one while another is set ("Attempt to override existing
# reduce_ex_hook"): walks, and copies (deepcopy reduces through that hook),
# must not overlap in one process. Worker threads, and the loader's thread
# seeding its own graph, take turns on this lock.
_GRAPH_LOCK = threading.RLock()
renew_after_fork(__name__, "_GRAPH_LOCK")  # a child forked mid-walk must not inherit it held


def graph_lock(dataset: Any) -> ContextManager[Any]:
    """The lock every walk or copy of a DataPipe graph holds in this process; a no-op for other datasets."""
    return _GRAPH_LOCK if is_datapipe(dataset) else contextlib.nullcontext()


def worker_copy(dataset: Any) -> Any:
    """A worker's own copy of a DataPipe graph (:func:`threadloader._platform.torch_compat.datapipe_worker_copy`)."""
    with _GRAPH_LOCK:
        return datapipe_worker_copy(dataset)


def is_datapipe(dataset: Any) -> bool:
    """Whether DataLoader treats ``dataset`` as a DataPipe graph (sharded in its workers)."""
    return isinstance(dataset, (IterDataPipe, MapDataPipe))


def seed_graph(dataset: Any, seed: int) -> None:
    """Seed the random pipes of a worker's graph from the epoch's shared seed, as a worker process does."""
    rng = torch.Generator()
    rng.manual_seed(seed)
    with _GRAPH_LOCK:
        apply_random_seed(dataset, rng)


def peek_shared_seed(generator: torch.Generator | None, group: Any = None) -> int:
    """The shared seed an epoch starting now would draw (DataLoader's draw), leaving the RNG as it is.

    Args:
        generator: the loader's generator; None: torch's global RNG.
        group: the process group DataLoader's iterator made for the seed (its ``_pg``), or None
            without one. Rank 0's draw is broadcast to every rank, as DataLoader does, so ranks
            whose RNGs differ still shuffle alike; every rank must then call this (a collective).
    """
    state = generator.get_state() if generator is not None else torch.get_rng_state()
    try:
        seed = torch.empty((), dtype=torch.int64).random_(generator=generator)
    finally:
        if generator is not None:
            generator.set_state(state)
        else:
            torch.set_rng_state(state)
    if group is not None:
        dist.broadcast(seed, src=0, group=group)
    return int(seed.item())


def _shard_then_init(init_fn: Callable[[int], None] | None, world_size: int, rank: int, worker_id: int) -> None:
    # Shard over every worker of every rank: ranks first, then workers, as DataLoader does.
    info = get_worker_info()
    with _GRAPH_LOCK:
        apply_sharding(info.dataset, info.num_workers * world_size, worker_id * world_size + rank)
    if init_fn is not None:
        init_fn(worker_id)


def sharding_init_fn(init_fn: Callable[[int], None] | None, world_size: int,
                     rank: int) -> Callable[[int], None]:
    """The ``worker_init_fn`` DataLoader runs for a DataPipe: shard the worker's graph, then ``init_fn``.

    Args:
        init_fn: the loader's own ``worker_init_fn``.
        world_size: the distributed world size (1 without a process group).
        rank: this process's rank (0 without a process group).
    """
    return functools.partial(_shard_then_init, init_fn, world_size, rank)
