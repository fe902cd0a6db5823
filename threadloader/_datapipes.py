"""DataPipe datasets in worker threads: what DataLoader's workers do to them.

DataLoader still serves ``torch.utils.data`` DataPipe graphs (``IterableWrapper
(...).shuffle().sharding_filter()``): each worker process gets its own copy of
the graph, seeds its random pipes with one seed shared by all workers (so they
shuffle alike, then each keeps its shard), and shards it in an extra
``worker_init_fn`` run before the user's. Worker threads do the same to their
own copy (:func:`threadloader._torch_compat.datapipe_worker_copy`, made with the
worker's other copies in :mod:`threadloader._replica`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch.utils.data import IterDataPipe, MapDataPipe, get_worker_info
from torch.utils.data.graph_settings import apply_random_seed, apply_sharding

__all__ = ["is_datapipe", "is_iter_datapipe", "peek_shared_seed", "seed_graph", "sharding_init_fn"]


def is_datapipe(dataset: Any) -> bool:
    """Whether DataLoader treats ``dataset`` as a DataPipe graph (sharded in its workers)."""
    return isinstance(dataset, (IterDataPipe, MapDataPipe))


def is_iter_datapipe(dataset: Any) -> bool:
    """Whether DataLoader seeds ``dataset``'s random pipes in its workers (iterable DataPipes only)."""
    return isinstance(dataset, IterDataPipe)


def seed_graph(dataset: Any, seed: int) -> None:
    """Seed the random pipes of a worker's graph from the epoch's shared seed, as a worker process does."""
    rng = torch.Generator()
    rng.manual_seed(seed)
    apply_random_seed(dataset, rng)


def peek_shared_seed(generator: torch.Generator | None) -> int:
    """The shared seed an epoch starting now would draw (DataLoader's draw), leaving the RNG as it is.

    Args:
        generator: the loader's generator; None: torch's global RNG.
    """
    state = generator.get_state() if generator is not None else torch.get_rng_state()
    try:
        return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())
    finally:
        if generator is not None:
            generator.set_state(state)
        else:
            torch.set_rng_state(state)


def _shard_then_init(init_fn: Callable[[int], None] | None, world_size: int, rank: int, worker_id: int) -> None:
    # Shard over every worker of every rank: ranks first, then workers, as DataLoader does.
    info = get_worker_info()
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
