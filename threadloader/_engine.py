"""The thread engine: worker threads, the work they share, and the iterator.

The consumer (the thread iterating the loader) drives everything, exactly as
DataLoader's main process does: it pulls indices from the sampler, assigns each
task (a batch, or one sample without batching) to a worker in DataLoader's
round-robin order, keeps at most ``prefetch_factor * num_workers`` tasks in
flight, and releases results in sampler order (or as ready with
``in_order=False``). Because sampler iteration stays on the consumer thread,
samplers need not be thread-safe and the global RNG is consumed exactly as
DataLoader consumes it.

A worker fetches the samples of its task one after another and collates them,
as a DataLoader worker process does. Keeping DataLoader's assignment (task i
goes to worker i mod num_workers while all are active) is what makes per-worker
randomness reproducible: each worker draws from its own generators in the same
order as the worker process with the same id would. A dataset with
``__getitems__`` gets one call per batch (torch's semantics). An IterableDataset
gets one replica iterator per worker.

The consumer talks to its workers through a *pool*: ``submit(worker_id,
job)``, a ``results`` queue it reads, ``generation`` / ``new_epoch()``,
``counters`` and ``stop()``. :class:`ThreadPool` (here) runs the workers as
threads of this process; ``threadloader._procs.ProcessPool`` spreads the same
threads over child processes (``worker_processes``). All state the threads
touch lives in :class:`_Shared`: one C-level job queue per worker and one
result queue. Neither the threads nor the pool reference the iterator object,
so dropping the iterator (``del``, garbage collection) runs its finalizer,
which stops the pool.
"""

from __future__ import annotations

import dataclasses
import itertools
import queue
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.autograd.profiler import record_function

from . import _context, worker
from ._interpreter import FREE_THREADED_BUILD
from ._intraop import limit_this_thread
from ._thread_view import WorkerThreadView
from ._torch_compat import (
    BaseDataLoaderIter,
    DatasetKind,
    ExceptionWrapper,
    SingleProcessDataLoaderIter,
    create_fetcher,
    pin_memory,
    profiler_enabled,
    warn_iterable_length,
)
from .state import EpochStart, RecordsProgressOnDrop, ResumePlan, progress_record
from .stats import LoaderStats, WorkerCounters

#: How long shutdown waits, in total, for threads to finish the user call they
#: are in. A thread stuck in user code is left to finish on its own (it is a
#: daemon and exits at its next check); we never wait on it for long.
JOIN_BUDGET_S = 1.0

#: On a free-threaded build, how often an idle worker thread wakes to free
#: the objects it made that other threads have dropped (see ``next_job``).
IDLE_WAKE_S = 0.05

#: Message kinds on the result queue. ``_CRASHED``: a worker process died;
#: its payload is the message of the RuntimeError the consumer raises.
_DATA, _STOPPED, _DIED, _CRASHED = 0, 1, 2, 3


@dataclass
class _Config:
    """What every worker thread needs; read-only once threads start."""

    dataset: Any
    kind: int
    auto_collation: bool
    has_getitems: bool  # auto-collated batches are one __getitems__ call
    collate_fn: Callable
    drop_last: bool
    base_seed: int
    init_fn: Callable | None
    num_workers: int
    pin: bool
    pin_device: str | None
    device_index: int | None


class _Shared:
    """What the pool's owner and its worker threads share.

    Hand-offs go through ``queue.SimpleQueue`` (C-level, cheap, and its
    blocking ``get`` releases the GIL and is interruptible): one job queue
    per worker (tasks are assigned, as in DataLoader) and one result queue
    (in a worker process, the process's ``torch.multiprocessing`` queue to
    the parent). Both are keyed by *global* worker id.
    """

    def __init__(self, worker_ids: list[int], results: Any, counters: Any) -> None:
        self.jobs = {w: queue.SimpleQueue() for w in worker_ids}
        self.results = results
        # Written by the owner, read by workers to skip stale or unneeded
        # work early; correctness never depends on a worker seeing it in time
        # (the consumer drops results of an old generation itself).
        self.generation = 0
        self.stopping = False
        self.counters = counters

    def post(self, gen: int, idx: int, worker_id: int, payload: Any) -> None:
        self.results.put((_DATA, gen, idx, worker_id, payload))

    def next_job(self, worker_id: int) -> Any:
        """Wait for the worker's next job (a task tuple, or None: stop)."""
        jobs = self.jobs[worker_id]
        if not FREE_THREADED_BUILD:
            return jobs.get()
        # A free-threaded build frees an object in the thread that made it,
        # when that thread next runs Python: batches the consumer has dropped
        # would live as long as their worker stays blocked here (an idle
        # persistent worker between epochs, a worker whose queue ran dry).
        # Waking up now and then lets it free them.
        while True:
            try:
                return jobs.get(timeout=IDLE_WAKE_S)
            except queue.Empty:
                pass


def _where(worker_id: int, what: str) -> str:
    return f"in DataLoader worker thread {worker_id} ({what})"


# --- worker side -----------------------------------------------------------------

def _worker_main(shared: _Shared, cfg: _Config, worker_id: int) -> None:
    """Body of one worker thread: set up worker info, init, then serve tasks."""
    try:
        # N workers must not each fan out over torch's intra-op pool.
        limit_this_thread()
        if cfg.pin and cfg.device_index is not None:
            torch.accelerator.set_device_index(cfg.device_index)
        # Its own copy, as a worker process has (persistent workers keep it);
        # the dataset's own methods passed as hooks follow it.
        replica = worker.worker_dataset(cfg.dataset)
        cfg = dataclasses.replace(
            cfg, dataset=replica, init_fn=worker.rebound(cfg.init_fn, cfg.dataset, replica),
            collate_fn=worker.rebound(cfg.collate_fn, cfg.dataset, replica))
        worker.enter_worker(worker_id, cfg.num_workers, cfg.base_seed, cfg.dataset)
        # This thread only ever collates for this loader: tell collate
        # functions (frame_collate) once whether batches get pinned.
        _context.set_collating(cfg.pin)
        init_error = None
        try:
            if cfg.init_fn is not None:
                cfg.init_fn(worker_id)
        except Exception:
            init_error = ExceptionWrapper(where=_where(worker_id, "worker_init_fn"))
        if cfg.kind == DatasetKind.Iterable:
            _serve_iterable(shared, cfg, worker_id, init_error)
        else:
            _serve_map(shared, cfg, worker_id, init_error)
    except BaseException as exc:  # noqa: BLE001 - reported to the consumer, never lost
        if not shared.stopping:
            shared.results.put((_DIED, shared.generation, -1, worker_id, exc))
    finally:
        _context.set_collating(False)
        worker.leave_worker()


def _finish(cfg: _Config, data: Any, counters: WorkerCounters, worker_id: int) -> Any:
    """Collate (when batching) and pin one task's data in this worker.

    Returns:
        The batch, or an ExceptionWrapper naming the step that failed.
    """
    t0 = time.perf_counter()
    try:
        data = cfg.collate_fn(data)
    except Exception:
        return ExceptionWrapper(where=_where(worker_id, "collate_fn"))
    counters.collate_s += time.perf_counter() - t0
    return pin_task(data, cfg.pin_device, counters, worker_id) if cfg.pin else data


def pin_task(data: Any, device: str | None, counters: Any, worker_id: int) -> Any:
    """Pin one task's batch as DataLoader's pin-memory thread does, counting the time.

    Returns:
        The pinned batch, or an ExceptionWrapper naming ``pin_memory``.
    """
    t0 = time.perf_counter()
    try:
        data = pin_memory(data, device)
    except Exception:
        return ExceptionWrapper(where=_where(worker_id, "pin_memory"))
    counters.pin_s += time.perf_counter() - t0
    return data


def _serve_map(shared: _Shared, cfg: _Config, worker_id: int, init_error: ExceptionWrapper | None) -> None:
    while _map_step(shared, cfg, worker_id, init_error):
        pass


def _fetch_map(cfg: _Config, index: Any, worker_id: int) -> Any:
    """The samples of one map-style task, in index order, or an ExceptionWrapper."""
    dataset = cfg.dataset
    if not cfg.auto_collation:
        try:
            return dataset[index]
        except Exception:
            return ExceptionWrapper(where=_where(worker_id, f"dataset index {index!r}"))
    if cfg.has_getitems:
        try:
            return dataset.__getitems__(index)
        except Exception:
            return ExceptionWrapper(where=_where(worker_id, "__getitems__"))
    data = []
    for i in index:
        try:
            data.append(dataset[i])
        except Exception:
            return ExceptionWrapper(where=_where(worker_id, f"dataset index {i!r}"))
    return data


def _map_step(shared: _Shared, cfg: _Config, worker_id: int, init_error: ExceptionWrapper | None) -> bool:
    """Serve one map-style task: fetch its samples, collate, post. False: stop.

    A function of its own so that its locals (samples, the collated batch)
    are released before the worker waits again: an idle persistent worker
    must not keep the last batch alive.
    """
    counters = shared.counters[worker_id]
    counters.busy = False
    job = shared.next_job(worker_id)
    if job is None or shared.stopping:
        return False
    counters.busy = True
    idx, gen, index = job
    if gen != shared.generation:
        return True  # an abandoned epoch's task: the consumer no longer waits for it
    if init_error is not None:
        shared.post(gen, idx, worker_id, init_error)
        return True
    t0 = time.perf_counter()
    payload = _fetch_map(cfg, index, worker_id)
    counters.fetch_s += time.perf_counter() - t0
    counters.items += len(index) if cfg.auto_collation else 1
    if not isinstance(payload, ExceptionWrapper):
        payload = _finish(cfg, payload, counters, worker_id)
    shared.post(gen, idx, worker_id, payload)
    counters.tasks += 1
    return True


class _Replica:
    """One worker's IterableDataset iterator and where it stands."""

    __slots__ = ("fetcher", "gen", "ended", "init_error")

    def __init__(self, init_error: ExceptionWrapper | None) -> None:
        self.fetcher: Any = None
        self.gen = -1
        self.ended = False
        self.init_error = init_error


def _serve_iterable(shared: _Shared, cfg: _Config, worker_id: int, init_error: ExceptionWrapper | None) -> None:
    counters = shared.counters[worker_id]

    def collate(data: Any) -> Any:
        t0 = time.perf_counter()
        out = _finish(cfg, data, counters, worker_id)
        counters.fetch_s -= time.perf_counter() - t0  # counted as collate, not fetch
        return out  # a failed collate/pin comes back as an ExceptionWrapper: the task's result

    replica = _Replica(init_error)
    while _iterable_step(shared, cfg, worker_id, replica, collate):
        pass


def _iterable_step(shared: _Shared, cfg: _Config, worker_id: int, replica: _Replica, collate: Callable) -> bool:
    """Serve one job (a function so that the batch is not kept while idle). False: stop."""
    counters = shared.counters[worker_id]
    counters.busy = False
    job = shared.next_job(worker_id)
    if job is None or shared.stopping:
        return False
    counters.busy = True
    idx, gen, index = job
    if replica.init_error is not None:
        shared.post(gen, idx, worker_id, replica.init_error)
        return True
    if gen != replica.gen:
        # A new epoch (persistent workers): a fresh replica iterator, as
        # DataLoader's workers make on _ResumeIteration.
        replica.gen, replica.ended, replica.fetcher = gen, False, None
        try:
            replica.fetcher = create_fetcher(cfg.kind, cfg.dataset, cfg.auto_collation, collate, cfg.drop_last)
        except Exception:
            replica.init_error = ExceptionWrapper(where=_where(worker_id, "IterableDataset.__iter__"))
            shared.post(gen, idx, worker_id, replica.init_error)
            return True
    if replica.ended:
        return True  # DataLoader's exhausted workers ignore further tasks
    t0 = time.perf_counter()
    try:
        payload = replica.fetcher.fetch(index)
    except StopIteration:
        replica.ended = True
        shared.results.put((_STOPPED, gen, idx, worker_id, None))
        return True
    except Exception:
        payload = ExceptionWrapper(where=_where(worker_id, "IterableDataset"))
    counters.fetch_s += time.perf_counter() - t0
    counters.items += len(index) if cfg.auto_collation else 1
    counters.tasks += 1
    shared.post(gen, idx, worker_id, payload)
    return True


def _drain(q: queue.SimpleQueue) -> None:
    while True:
        try:
            q.get_nowait()
        except queue.Empty:
            return


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


class ThreadPool:
    """Worker threads for some of a loader's worker ids (all of them, or one process's share).

    Args:
        cfg: what every worker needs.
        worker_ids: the global ids of the workers to run here.
        results: where workers post ``(kind, generation, task, worker_id,
            payload)``; a fresh ``SimpleQueue`` when None.
        counters: per-worker counters keyed by global id; fresh
            :class:`WorkerCounters` when None.
    """

    def __init__(self, cfg: _Config, worker_ids: list[int], results: Any = None, counters: Any = None) -> None:
        self._owns_results = results is None
        if results is None:
            results = queue.SimpleQueue()
        if counters is None:
            counters = [WorkerCounters() for _ in range(cfg.num_workers)]
        self._shared = shared = _Shared(list(worker_ids), results, counters)
        self.results = results
        self.counters = counters
        self._threads = [
            threading.Thread(target=_worker_main, args=(shared, cfg, w), name=f"threadloader-worker-{w}", daemon=True)
            for w in worker_ids
        ]
        for thread in self._threads:
            thread.start()

    @property
    def generation(self) -> int:
        return self._shared.generation

    def submit(self, worker_id: int, job: tuple[int, int, Any]) -> None:
        """Queue ``(task, generation, index)`` for worker ``worker_id``."""
        self._shared.jobs[worker_id].put(job)

    def new_epoch(self, generation: int | None = None) -> None:
        """Drop queued jobs; results of older generations are stale from now on."""
        shared = self._shared
        shared.generation = shared.generation + 1 if generation is None else generation
        for jobs in shared.jobs.values():
            _drain(jobs)

    @property
    def workers(self) -> list[WorkerThreadView]:
        """Process-like views of the worker threads, in worker order."""
        return [WorkerThreadView(t) for t in self._threads]

    def stop(self) -> None:
        """Stop and join the threads (idempotent), dropping undelivered results."""
        _stop_threads(self._shared, self._threads)
        if self._owns_results:
            _drain(self.results)


# --- consumer side ---------------------------------------------------------------

_MISSING = object()


class ThreadedLoaderIter(RecordsProgressOnDrop, BaseDataLoaderIter):
    """DataLoader's iterator protocol, served by worker threads."""

    def __init__(self, loader: Any, plan: ResumePlan | None = None) -> None:
        super().__init__(loader)
        if plan is not None:
            # Replay the interrupted epoch: its base seed, then its random
            # states, so the sampler draws exactly what it drew then.
            self._base_seed = plan.start.base_seed
            plan.start.apply(loader)
            self._epoch_start = plan.start
        else:
            self._epoch_start = EpochStart.capture(loader, self._base_seed)
        self._plan = plan
        self._prefetch_factor = loader.prefetch_factor
        self._in_order = loader.in_order
        if self._num_workers <= 0:
            raise AssertionError("num_workers must be greater than 0 for ThreadedLoaderIter")
        if self._prefetch_factor <= 0:
            raise AssertionError("prefetch_factor must be greater than 0 for ThreadedLoaderIter")
        self._is_iterable = self._dataset_kind == DatasetKind.Iterable
        self._stats = LoaderStats()
        device_index = None
        if self._pin_memory and torch.accelerator.is_available():
            device_index = torch.accelerator.current_device_index()
        cfg = _Config(
            dataset=self._dataset,
            kind=self._dataset_kind,
            auto_collation=self._auto_collation,
            # as torch's map fetcher decides it
            has_getitems=bool(getattr(self._dataset, "__getitems__", None)),
            collate_fn=self._collate_fn,
            drop_last=self._drop_last,
            base_seed=self._base_seed,
            init_fn=loader.worker_init_fn,
            num_workers=self._num_workers,
            pin=self._pin_memory,
            pin_device=self._pin_memory_device,
            device_index=device_index,
        )
        self._failure: str | None = None
        processes = getattr(loader, "worker_processes", 0)
        if processes:
            from ._procs import ProcessPool  # the process layer builds on this module

            self._pool: Any = ProcessPool(cfg, processes, loader.multiprocessing_context)
        else:
            self._pool = ThreadPool(cfg, list(range(self._num_workers)))
        # Runs on del / garbage collection of this iterator, on explicit
        # shutdown, and at interpreter exit (weakref.finalize's atexit hook).
        self._finalizer = weakref.finalize(self, self._pool.stop)
        self._stats.bind(self._pool.counters, self._num_workers)
        self._reset(loader, first_iter=True)
        if plan is not None:
            self._num_yielded = plan.num_yielded

    def __next__(self) -> Any:
        # DataLoader wraps every step in a profiler record_function, even when
        # no profiler runs. Its exit op releases the GIL, and with busy worker
        # threads the consumer then waits for the GIL on every item. Keep the
        # profiler range when a profiler is active; skip it otherwise. Both
        # paths take one step through _step, so warnings point at the caller.
        if profiler_enabled():
            with record_function(self._profile_name):
                return self._step()
        return self._step()

    def _step(self) -> Any:
        if self._sampler_iter is None:
            self._reset()  # type: ignore[call-arg]  # as torch does
        data = self._next_data()
        self._num_yielded += 1
        if (
            self._IterableDataset_len_called is not None
            and self._dataset_kind == DatasetKind.Iterable
            and self._num_yielded > self._IterableDataset_len_called
        ):
            warn_iterable_length(self._dataset, self._IterableDataset_len_called, self._num_yielded, self._num_workers)
        return data

    # DataLoader's protocol -----------------------------------------------------
    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        if not first_iter:  # a persistent iterator's next epoch
            self._plan = None
            self._epoch_start = EpochStart.capture(loader, self._base_seed)
        super()._reset(loader, first_iter)
        self._finished = False
        # Tasks received ahead of _rcvd_idx (in_order=False), for checkpoints.
        self._consumed_ahead: set[int] = set(self._plan.consumed_extra) if self._plan else set()
        self._send_idx = 0
        self._rcvd_idx = 0
        self._task_info: dict[int, int] = {}  # task -> assigned worker
        self._task_items: dict[int, int] = {}  # task -> number of samples asked for
        self._tasks_outstanding = 0
        self._workers_status = [True] * self._num_workers
        self._workers_num_tasks = [0] * self._num_workers
        self._worker_queue_idx_cycle = itertools.cycle(range(self._num_workers))
        self._stash: dict[int, tuple[int, Any]] = {}  # results received ahead of their turn
        if not first_iter:
            self._pool.new_epoch()  # results of the old epoch are dropped on arrival
            self._stats.new_epoch()
        for _ in range(self._prefetch_factor * self._num_workers):
            self._try_put_index()

    def _try_put_index(self) -> None:
        max_tasks = self._prefetch_factor * self._num_workers
        if self._tasks_outstanding >= max_tasks:
            raise AssertionError("Number of outstanding tasks exceeded maximum allowed tasks")
        while True:
            try:
                index = self._next_index()
            except StopIteration:
                return
            idx = self._send_idx
            if self._plan is None or self._is_iterable or not self._plan.skips(idx):
                break
            # Received before the checkpoint: skip it without fetching. The
            # task number stays taken, so later tasks keep their numbers.
            self._send_idx += 1
        for _ in range(self._num_workers):  # the next active worker, as DataLoader picks it
            worker_id = next(self._worker_queue_idx_cycle)
            if self._workers_status[worker_id]:
                if self._in_order or self._workers_num_tasks[worker_id] < max_tasks // sum(self._workers_status):
                    break
        else:
            return
        if self._auto_collation and not self._is_iterable and not isinstance(index, (list, tuple)):
            index = list(index)  # a batch sampler may yield any iterable of indices
        pool = self._pool
        pool.submit(worker_id, (idx, pool.generation, index))
        self._workers_num_tasks[worker_id] += 1
        self._task_info[idx] = worker_id
        self._task_items[idx] = len(index) if self._auto_collation and hasattr(index, "__len__") else 1
        self._tasks_outstanding += 1
        self._send_idx += 1

    def _next_data(self) -> Any:
        if self._failure is not None:  # a worker process died: the workers are gone
            raise RuntimeError(self._failure)
        while True:
            while self._rcvd_idx < self._send_idx:
                worker_id = self._task_info.get(self._rcvd_idx, _MISSING)
                if worker_id is not _MISSING:
                    if self._workers_status[worker_id] or self._has_result(self._rcvd_idx):
                        break
                    del self._task_info[self._rcvd_idx]
                    self._task_items.pop(self._rcvd_idx, None)
                self._consumed_ahead.discard(self._rcvd_idx)  # passed: no longer "ahead"
                self._rcvd_idx += 1
            else:
                self._finished = True
                if not self._persistent_workers:
                    self._shutdown_workers()
                raise StopIteration
            kind, idx, worker_id, payload = self._wait_for_result()
            self._tasks_outstanding -= 1
            if kind == _STOPPED:
                self._workers_status[worker_id] = False
                self._try_put_index()
                continue
            del self._task_info[idx]
            items = self._task_items.pop(idx, 1)
            if idx == self._rcvd_idx:
                self._rcvd_idx += 1
            else:
                self._consumed_ahead.add(idx)
            self._workers_num_tasks[worker_id] -= 1
            self._try_put_index()
            if self._plan is not None and self._is_iterable and self._plan.skips(idx):
                continue  # an IterableDataset batch received before the checkpoint
            if isinstance(payload, ExceptionWrapper):
                payload.reraise()
            self._stats.delivered(items)
            return payload

    # helpers ----------------------------------------------------------------------
    def _has_result(self, idx: int) -> bool:
        return idx in self._stash

    def _wait_for_result(self) -> tuple[int, int, int, Any]:
        """The next result to act on: (kind, task, worker, payload)."""
        if self._in_order:
            if self._rcvd_idx in self._stash:
                return (_DATA, self._rcvd_idx, *self._stash.pop(self._rcvd_idx))
        elif self._stash:
            idx = next(iter(self._stash))  # arrival order
            return (_DATA, idx, *self._stash.pop(idx))
        pool = self._pool
        results = pool.results
        timeout = self._timeout if self._timeout > 0 else None
        deadline = None if timeout is None else time.monotonic() + timeout
        t0 = time.perf_counter()
        try:
            while True:
                try:
                    if deadline is None:
                        kind, gen, idx, worker_id, payload = results.get()
                    else:
                        kind, gen, idx, worker_id, payload = results.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds") from None
                if kind == _CRASHED:
                    self._failure = payload
                    self._shutdown_workers()
                    raise RuntimeError(payload)
                if kind == _DIED:
                    raise RuntimeError(
                        f"DataLoader worker (thread {worker_id}) exited unexpectedly: {payload!r}") from payload
                if gen != pool.generation:
                    continue  # from an epoch that was abandoned
                if kind == _STOPPED or not self._in_order or idx == self._rcvd_idx:
                    return kind, idx, worker_id, payload
                self._stash[idx] = (worker_id, payload)
        finally:
            self._stats.waited(time.perf_counter() - t0)

    def _shutdown_workers(self) -> None:
        self._finalizer()

    @property
    def _workers(self) -> list[Any]:
        """One process-like object per worker, as DataLoader's iterator has ``_workers``."""
        return self._pool.workers

    def progress(self) -> dict[str, Any] | None:
        """This epoch's checkpoint record, or None once the epoch is over."""
        if self._finished:
            return None
        extra = [i for i in self._consumed_ahead if i >= self._rcvd_idx]
        return progress_record(self._epoch_start, self._rcvd_idx, extra, self._num_yielded)

    @property
    def stats(self) -> LoaderStats:
        """Counters of this iterator (see :class:`threadloader.stats.LoaderStats`)."""
        return self._stats


class ResumableSingleIter(RecordsProgressOnDrop, SingleProcessDataLoaderIter):
    """DataLoader's own ``num_workers=0`` iterator, with checkpoint and resume."""

    def __init__(self, loader: Any, plan: ResumePlan | None = None) -> None:
        super().__init__(loader)
        self._finished = False
        if plan is None:
            self._epoch_start = EpochStart.capture(loader, self._base_seed)
        else:
            self._base_seed = plan.start.base_seed
            plan.start.apply(loader)
            self._epoch_start = plan.start
            self._sampler_iter = iter(self._index_sampler)
            for _ in range(plan.consumed_prefix):
                try:
                    if self._dataset_kind == DatasetKind.Iterable:
                        self._dataset_fetcher.fetch(self._next_index())  # replicas advance only by reading
                    else:
                        self._next_index()
                except StopIteration:
                    break
            self._num_yielded = plan.num_yielded
        # Samplers draw their randomness on the first index. Draw it now, as
        # DataLoader's worker iterator does by prefetching, so a checkpoint
        # taken before the first batch already holds the epoch's draws.
        first = next(self._sampler_iter, _MISSING)
        if first is not _MISSING:
            self._sampler_iter = itertools.chain([first], self._sampler_iter)

    def _next_data(self) -> Any:
        try:
            return super()._next_data()
        except StopIteration:
            self._finished = True
            raise

    def progress(self) -> dict[str, Any] | None:
        """This epoch's checkpoint record, or None once the epoch is over."""
        if self._finished:
            return None
        return progress_record(self._epoch_start, self._num_yielded, [], self._num_yielded)
