"""Worker info and per-worker randomness for worker threads.

Each worker thread gets torch's own ``WorkerInfo`` (``worker_method="thread"``)
in a thread-local slot (``seed = base_seed + worker_id`` as in DataLoader). It
also gets its own generators, seeded exactly as ``torch``'s ``_worker_loop``
seeds a worker process: ``random.Random(seed)``, a ``torch.Generator`` seeded
with ``seed`` and a legacy NumPy ``RandomState`` seeded with
``_generate_state(base_seed, id)``. While the thread is a worker, the *global*
RNG API (``torch.manual_seed``, ``torch.rand``, ``random.random``,
``np.random.rand``...) acts on those generators (see :mod:`.rng`). So worker
code behaves as in a worker process, and the training loop's RNG is never
touched. ``info.rng`` holds the same generators
(``torch.random.thread_safe_generator()`` returns the worker's torch generator).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from .._platform import torch_compat as _torch_compat
from . import collate as _collate
from . import rng as _rng

_torch_compat.install()
_collate.install()
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
        dataset: the dataset the worker reads (its copy: :func:`threadloader.worker.copies.worker_parts`).
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
    np.random.seed(_torch_compat.numpy_seed_state(base_seed, worker_id))


def leave_worker() -> None:
    """Clear the calling thread's worker info and give it the global RNG API back."""
    _rng.leave()
    info = _torch_compat.get_thread_worker_info()
    if info is not None and _torch_compat.process_worker_info() is info:
        _torch_compat.set_process_worker_info(None)
    _torch_compat.set_thread_worker_info(None)
