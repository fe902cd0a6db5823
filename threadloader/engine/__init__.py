"""The thread engine: worker threads that serve a loader's tasks, and the iterator that drives them.

* :mod:`.iterator` -- the consumer side: :class:`ThreadedLoaderIter` assigns
  the sampler's tasks to workers in DataLoader's order and releases results in
  sampler order;
* :mod:`.protocol` -- what the iterator and a pool exchange: :class:`~.protocol.Pool`,
  jobs, result messages and their kinds, the workers' configuration;
* :mod:`.thread_pool` -- :class:`ThreadPool`, the worker threads of this process
  (the process layer, :mod:`threadloader.procs`, runs one in each child);
* :mod:`.worker_loop` -- what one worker thread runs: set-up as a DataLoader
  worker (:mod:`threadloader.worker`), fetch, collate, post;
* :mod:`.hooks` -- what the layers above run while an iterator or a worker
  runs (the image path's buffer reservations);
* :mod:`.thread_view` -- process-like views of the threads (``_workers``);
* :mod:`.single` -- the ``num_workers=0`` iterator (DataLoader's own, with
  checkpoint and resume).

The engine imports neither the process layer nor the image path: the loader
hands the iterator its pool factory, and the image path registers its hooks.
"""

from .iterator import ThreadedLoaderIter
from .single import ResumableSingleIter
from .thread_pool import JOIN_BUDGET_S, ThreadPool, start_thread_pool

__all__ = ["JOIN_BUDGET_S", "ResumableSingleIter", "ThreadPool", "ThreadedLoaderIter", "start_thread_pool"]
