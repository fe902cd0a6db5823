"""The pool of worker threads: :class:`ThreadPool` starts, feeds and stops them.

A pool runs some of a loader's workers (all of them here, or one child
process's share under ``worker_processes``) as threads of this process. Each
worker runs :func:`threadloader.engine.worker_loop._worker_main` on its own
copy of the dataset, started in the grad mode and contextvars of the thread
starting the pool (:mod:`threadloader.worker.inherit`), and posts its results
to one queue. The pool owns its threads: :meth:`ThreadPool.stop` tells them to
stop and joins them within :data:`JOIN_BUDGET_S`.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from .._platform import malloc
from ..stats.counters import WorkerCounters
from ..worker import inherit
from ..worker.copies import WorkerParts, retire, worker_parts
from .protocol import STOPPED_MESSAGE, Job, WorkerConfig
from .thread_view import WorkerThreadView
from .worker_loop import _drain, _Shared, _worker_main

__all__ = ["JOIN_BUDGET_S", "ThreadPool", "parts_for", "start_thread_pool"]

#: How long shutdown waits, in total, for threads to finish the user call they
#: are in. A thread stuck in user code is left to finish on its own (it is a
#: daemon and exits at its next check); we never wait on it for long.
JOIN_BUDGET_S = 1.0


def parts_for(cfg: WorkerConfig, worker_id: int) -> WorkerParts:
    """Worker ``worker_id``'s copies of the dataset and hooks: new ones, or those it had if it was handed over."""
    handoff = cfg.handoff(worker_id)
    if handoff is not None:
        return handoff.parts
    return worker_parts(cfg.dataset, cfg.init_fn, cfg.collate_fn)


def _stop_threads(shared: _Shared, threads: list[threading.Thread]) -> None:
    """Tell every worker to stop, then join them within :data:`JOIN_BUDGET_S`."""
    shared.stopping = True
    for jobs in shared.jobs.values():
        _drain(jobs)
        jobs.put(None)
    deadline = time.monotonic() + JOIN_BUDGET_S
    current = threading.current_thread()
    for thread in threads:
        if thread is not current:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


def _run_worker(caller: Any, shared: _Shared, cfg: WorkerConfig, worker_id: int, parts_of: dict[int, Any],
                finished: set[int]) -> None:
    """Body of a worker thread: the worker loop on its copies, which it retires itself if it outlives stop()."""
    try:
        inherit.run_inheriting(caller, _worker_main, shared, cfg, worker_id, parts_of[worker_id])
    finally:
        # ThreadPool._retire_finished retires the copies of the threads done when the
        # pool stops. One still in user code then (a slow __getitem__ past
        # JOIN_BUDGET_S) is done with its copies only now: left to the
        # collector, their __del__ would run with the attributes they share
        # (closing the original's file). Marked done before reading
        # ``stopping``, which stop() sets before reading the marks: one of
        # the two sees the other.
        finished.add(worker_id)
        if shared.stopping:
            _retire_once(parts_of, worker_id)


def _retire_once(parts_of: dict[int, Any], worker_id: int) -> None:
    """Retire ``worker_id``'s copies unless already done (by the pool or by its thread: whoever pops them)."""
    parts = parts_of.pop(worker_id, None)  # atomic, GIL or not: exactly one caller gets them
    if parts is not None:
        retire(parts)


class ThreadPool:
    """Worker threads for some of a loader's worker ids (all of them, or one process's share).

    Args:
        cfg: what every worker needs.
        worker_ids: the global ids of the workers to run here.
        results: where workers post their :class:`~.protocol.Message` s; a
            fresh ``SimpleQueue`` when None.
        counters: per-worker counters keyed by global id; fresh
            :class:`WorkerCounters` when None.
        caller: the state the threads start in (:func:`threadloader.worker.inherit.capture`);
            the calling thread's when None.
    """

    #: Its workers are threads of this process (:class:`~.protocol.Pool`).
    in_process = True

    def __init__(self, cfg: WorkerConfig, worker_ids: list[int], results: Any = None, counters: Any = None,
                 caller: inherit.CallerState | None = None) -> None:
        self._owns_results = results is None
        if results is None:
            results = queue.SimpleQueue()
        if counters is None:
            counters = [WorkerCounters() for _ in range(cfg.num_workers)]
        self._shared = shared = _Shared(list(worker_ids), results, counters)
        self.results = results
        self.counters = counters
        # Each worker's own copy of the dataset, as a worker process has
        # (persistent workers keep it). Made here, before the epoch draws its
        # order: generators the dataset shares with the sampler are copied in
        # the state they had when the workers started, as a process forks them.
        # Its worker_init_fn and collate_fn too, where they hold generators or
        # lead to the dataset (a partial holding it), as they travel with it to a process.
        self._parts = parts = {w: parts_for(cfg, w) for w in worker_ids}
        #: Worker id -> its copy of the dataset (a persistent IterableDataset
        #: copy carries its own state from epoch to epoch, as in a worker process).
        self.replicas = {w: p.dataset for w, p in parts.items()}
        # Each worker starts as a forked worker process would: in the grad
        # mode and contextvars of the thread starting the pool (threadloader.worker.inherit).
        #: The starting thread's state, which the workers started in.
        self.caller = caller = inherit.capture() if caller is None else caller
        # Threads that allocate big blocks fault fresh pages on each one until glibc's thresholds rise.
        malloc.settle()
        self._finished: set[int] = set()  # workers whose thread is done with its copies
        self._threads = [
            threading.Thread(target=_run_worker, args=(caller, shared, cfg, w, parts, self._finished),
                             name=f"threadloader-worker-{w}", daemon=True)
            for w in worker_ids
        ]
        started: list[threading.Thread] = []
        try:
            for thread in self._threads:
                thread.start()  # "can't start new thread" under a thread limit
                started.append(thread)
        except BaseException:
            _stop_threads(shared, started)  # the ones running would wait for jobs for ever
            self._retire_finished()
            raise

    def _retire_finished(self) -> None:
        """After ``stopping`` is set: retire the copies of every worker done with them (or never started)."""
        for worker_id, thread in zip(self.replicas, self._threads):  # both in worker order
            if worker_id in self._finished or thread.ident is None:
                _retire_once(self._parts, worker_id)

    @property
    def generation(self) -> int:
        return self._shared.generation

    def submit(self, worker_id: int, job: Job) -> None:
        """Queue ``job`` for worker ``worker_id``.

        Raises:
            RuntimeError: the pool was stopped (no thread would ever run it).
        """
        if self._shared.stopping:
            raise RuntimeError(STOPPED_MESSAGE)
        self._shared.jobs[worker_id].put(job)

    def take_queued(self, worker_id: int) -> list[Job]:
        """Take back the jobs queued for ``worker_id`` that it has not started, in order."""
        taken = []
        jobs = self._shared.jobs[worker_id]
        while True:
            try:
                job = jobs.get_nowait()
            except queue.Empty:
                return taken
            if job is not None:
                taken.append(job)

    def new_epoch(self, generation: int | None = None, seed: int | None = None) -> None:
        """Start a new generation: results of older ones are stale from now on.

        Jobs already queued still run, in order, before the new epoch's: as
        DataLoader's persistent worker processes finish an abandoned epoch's
        prefetched tasks, so that each worker's random streams advance by the
        same draws, whatever the timing (the consumer drops their results).

        Args:
            generation: the new generation's number (default: the next one).
            seed: an iterable DataPipe's shared seed for the new epoch, reseeding
                each worker's graph when it reaches the epoch's first job.

        Raises:
            RuntimeError: the pool was stopped.
        """
        if self._shared.stopping:
            raise RuntimeError(STOPPED_MESSAGE)
        self._shared.new_epoch(generation, seed)

    @property
    def workers(self) -> list[WorkerThreadView]:
        """Process-like views of the worker threads, in worker order."""
        return [WorkerThreadView(t) for t in self._threads]

    @property
    def threads(self) -> list[threading.Thread]:
        """The worker threads themselves, in worker order."""
        return list(self._threads)

    def stop(self, keep_copies: bool = False) -> None:
        """Stop and join the threads (idempotent), dropping undelivered results.

        Args:
            keep_copies: leave the workers' copies as they are: they were
                handed over to go on in this process (else they are retired).
        """
        if keep_copies:
            self._parts.clear()  # no thread retires them as it ends (_run_worker)
        _stop_threads(self._shared, self._threads)
        # One still running retires its copies when it ends (_run_worker).
        self._retire_finished()
        if self._owns_results:
            _drain(self.results)


def start_thread_pool(cfg: WorkerConfig) -> ThreadPool:
    """A pool running all of a loader's workers as threads of this process (the default :data:`~.protocol.PoolFactory`)."""
    return ThreadPool(cfg, list(range(cfg.num_workers)))
