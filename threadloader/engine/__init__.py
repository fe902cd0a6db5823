"""The thread engine: worker threads that serve a loader's tasks, and the iterator that drives them.

* :mod:`.iterator` -- the consumer side: :class:`ThreadedLoaderIter` assigns
  the sampler's tasks to workers in DataLoader's order and releases results in
  sampler order;
* :mod:`.protocol` -- what the iterator and a pool exchange: :class:`~.protocol.Pool`,
  jobs, result messages and their kinds, the workers' configuration;
* :mod:`.pool` -- :class:`ThreadPool`, the worker threads of this process
  (the process layer, :mod:`threadloader._procs`, runs one in each child);
* :mod:`.worker_loop` -- what one worker thread runs: set-up as a DataLoader
  worker, fetch, collate, post;
* :mod:`.inherit` -- what a worker thread takes over from the thread starting
  it (grad mode, contextvars), as a forked worker process would;
* :mod:`.intraop` -- one torch intra-op thread per worker thread;
* :mod:`.thread_view` -- process-like views of the threads (``_workers``);
* :mod:`.single` -- the ``num_workers=0`` iterator (DataLoader's own, with
  checkpoint and resume).
"""

from .iterator import ThreadedLoaderIter
from .pool import JOIN_BUDGET_S, ThreadPool, thread_pool
from .single import ResumableSingleIter

__all__ = ["JOIN_BUDGET_S", "ResumableSingleIter", "ThreadPool", "ThreadedLoaderIter", "thread_pool"]
