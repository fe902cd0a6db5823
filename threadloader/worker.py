"""Worker info and seeding for worker threads.

Each worker thread gets torch's own ``WorkerInfo`` (``worker_method="thread"``)
in a thread-local slot, seeded exactly as DataLoader seeds worker processes
(``seed = base_seed + worker_id``), with per-thread ``random.Random``,
``torch.Generator`` and NumPy ``Generator`` in ``info.rng``. The global RNGs are
never reseeded: threads share them, and reseeding from one thread would change
what every other thread (and the training loop) draws.
"""

from __future__ import annotations

from typing import Any

from . import _torch_compat

_torch_compat.install()

#: ``torch.utils.data.get_worker_info`` itself (made thread-aware): the info of
#: the calling worker thread, or of the worker process, or None elsewhere.
get_worker_info = _torch_compat.TORCH_GET_WORKER_INFO


def enter_worker(worker_id: int, num_workers: int, base_seed: int, dataset: Any) -> Any:
    """Make the calling thread worker ``worker_id`` and return its info.

    Args:
        worker_id: 0 .. num_workers - 1.
        num_workers: the loader's ``num_workers``.
        base_seed: the seed the iterator drew from the loader's generator.
        dataset: the dataset the worker reads (shared, not copied).

    Returns:
        The ``WorkerInfo`` now returned by ``get_worker_info()`` in this thread.
    """
    info = _torch_compat.make_worker_info(worker_id, num_workers, base_seed, dataset)
    _torch_compat.set_thread_worker_info(info)
    return info


def leave_worker() -> None:
    """Clear the calling thread's worker info."""
    _torch_compat.set_thread_worker_info(None)
