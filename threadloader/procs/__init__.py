"""The process layer: a loader's worker threads spread over child processes (``worker_processes``).

* :mod:`.pool` -- :class:`ProcessPool`, the parent's side: starts the
  children, feeds them jobs, receives their results, notices their deaths,
  stops them;
* :mod:`.child` -- the body of a child: its dispatcher, its worker threads,
  its watch on the parent;
* :mod:`.jobs` -- a child's job queue, written straight to its pipe;
* :mod:`.wire` -- the messages between them (results pickled on their own,
  the exceptions that end worker threads);
* :mod:`.counters` -- the workers' counters as rows of one shared array.
"""

from .process_pool import ProcessPool, check_worker_processes, process_pool_factory

__all__ = ["ProcessPool", "check_worker_processes", "process_pool_factory"]
