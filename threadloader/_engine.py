"""The thread engine: worker threads, the work they share, and the iterator.

The consumer (the thread iterating the loader) drives everything, exactly as
DataLoader's main process does: it pulls indices from the sampler, hands tasks
to the workers, keeps at most ``prefetch_factor * num_workers`` tasks in
flight, and releases results in sampler order (or as ready with
``in_order=False``). Because sampler iteration stays on the consumer thread,
samplers need not be thread-safe and the global RNG is consumed exactly as
DataLoader consumes it.

Map-style datasets are fetched per *sample*: a batch is split into units that
any worker may take, and the worker that completes a batch's last unit collates
it. One slow sample therefore does not stall a whole worker's batch. A dataset
with ``__getitems__`` gets one call per batch (torch's semantics). An
IterableDataset gets one replica iterator per worker and the round-robin task
assignment DataLoader uses, so the batch sequence is the same.

All state the threads touch lives in :class:`_Shared`: C-level queues for
hand-offs, and one lock for the per-batch completion counts. The threads never
reference the iterator object, so dropping the iterator (``del``, garbage
collection) runs its finalizer, which stops and joins them.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch

from . import _context, worker
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

#: A worker takes several units per queue round-trip when samples are cheap;
#: this is the work (seconds) it aims to take at once.
_CHUNK_TARGET_S = 200e-6
_MAX_CHUNK = 64

#: Message kinds on the result queue.
_DATA, _STOPPED, _DIED = 0, 1, 2


@dataclass
class _Config:
    """What every worker thread needs; read-only once threads start."""

    dataset: Any
    kind: int
    auto_collation: bool
    collate_fn: Callable
    drop_last: bool
    base_seed: int
    init_fn: Callable | None
    num_workers: int
    pin: bool
    pin_device: str | None
    device_index: int | None


class _Batch:
    """One task of a map-style dataset, filled unit by unit (under ``_Shared.lock``)."""

    __slots__ = ("idx", "gen", "index", "slots", "remaining", "error", "whole")

    def __init__(self, idx: int, gen: int, index: Any, n_units: int, whole: bool) -> None:
        self.idx = idx
        self.gen = gen
        self.index = index  # the sampler's index (a list when auto-collating)
        self.slots: list[Any] = [None] * n_units
        self.remaining = max(n_units, 1)  # an empty index list is one (empty) unit
        self.error: ExceptionWrapper | None = None
        self.whole = whole  # one unit for the whole batch (__getitems__ / no batching)


class _Shared:
    """What the consumer and the worker threads share.

    Hand-offs go through ``queue.SimpleQueue`` (C-level, cheap, and its
    blocking ``get`` releases the GIL and is interruptible): map-style units
    on one shared queue, IterableDataset jobs on one queue per worker (tasks
    are assigned), and every result on one result queue, as in DataLoader.
    ``lock`` guards only the per-batch completion counts.
    """

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self.lock = threading.Lock()
        self.units: queue.SimpleQueue = queue.SimpleQueue()
        self.jobs = [queue.SimpleQueue() for _ in range(num_workers)]
        self.results: queue.SimpleQueue = queue.SimpleQueue()
        # Written by the consumer, read by workers to skip stale or unneeded
        # work early; correctness never depends on a worker seeing it in time
        # (the consumer drops results of an old generation itself).
        self.generation = 0
        self.stopping = False
        self.counters = [WorkerCounters() for _ in range(num_workers)]

    def post(self, gen: int, idx: int, worker_id: int, payload: Any) -> None:
        self.results.put((_DATA, gen, idx, worker_id, payload))


def _where(worker_id: int, what: str) -> str:
    return f"in DataLoader worker thread {worker_id} ({what})"


# --- worker side -----------------------------------------------------------------

def _worker_main(shared: _Shared, cfg: _Config, worker_id: int) -> None:
    """Body of one worker thread: set up worker info, init, then serve tasks."""
    try:
        if cfg.pin and cfg.device_index is not None:
            torch.accelerator.set_device_index(cfg.device_index)
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
    t1 = time.perf_counter()
    counters.collate_s += t1 - t0
    if cfg.pin:
        try:
            data = pin_memory(data, cfg.pin_device)
        except Exception:
            return ExceptionWrapper(where=_where(worker_id, "pin_memory"))
        counters.pin_s += time.perf_counter() - t1
    return data


def _take(units: queue.SimpleQueue, limit: int) -> list | None:
    """Block for one unit, then take up to ``limit`` without blocking. None: stop."""
    first = units.get()
    if first is None:
        return None
    work = [first]
    while len(work) < limit and not units.empty():  # empty(): no exception per miss
        try:
            unit = units.get_nowait()
        except queue.Empty:  # another worker was quicker
            break
        if unit is None:  # a stop sentinel: leave it for... no one needs it but us
            units.put(None)
            break
        work.append(unit)
    return work


def _serve_map(shared: _Shared, cfg: _Config, worker_id: int, init_error: ExceptionWrapper | None) -> None:
    per_unit_s: float | None = _CHUNK_TARGET_S  # running estimate of one unit's fetch time
    while per_unit_s is not None:
        per_unit_s = _map_step(shared, cfg, worker_id, init_error, per_unit_s)


def _map_step(
    shared: _Shared, cfg: _Config, worker_id: int, init_error: ExceptionWrapper | None, per_unit_s: float
) -> float | None:
    """Take a chunk of units, fetch them, and collate every batch it completes.

    A function of its own so that its locals (samples, the collated batch)
    are released before the worker waits again: an idle persistent worker
    must not keep the last batch alive. Returns the new per-unit estimate, or
    None when the worker must stop.
    """
    counters = shared.counters[worker_id]
    counters.busy = False
    work = _take(shared.units, max(1, min(_MAX_CHUNK, int(_CHUNK_TARGET_S / per_unit_s))))
    if work is None or shared.stopping:
        return None
    counters.busy = True
    dataset = cfg.dataset
    done: list[tuple[_Batch, int, Any]] = []
    t0 = time.perf_counter()
    for batch, pos in work:
        if batch.error is not None or batch.gen != shared.generation or pos < 0:
            done.append((batch, pos, None))  # failed, abandoned, or an empty batch
            continue
        if init_error is not None:
            done.append((batch, pos, init_error))
            continue
        try:
            if batch.whole and cfg.auto_collation:
                value = dataset.__getitems__(batch.index)
            elif batch.whole:
                value = dataset[batch.index]
            else:
                value = dataset[batch.index[pos]]
        except Exception:
            what = "__getitems__" if batch.whole and cfg.auto_collation else (
                f"dataset index {batch.index if batch.whole else batch.index[pos]!r}")
            value = ExceptionWrapper(where=_where(worker_id, what))
        done.append((batch, pos, value))
    elapsed = time.perf_counter() - t0
    counters.fetch_s += elapsed
    counters.items += len(work)
    completed = []
    shared_units = []
    for item in done:
        batch, pos, value = item
        if len(batch.slots) > 1:
            shared_units.append(item)  # other workers may hold units of this batch
            continue
        # A batch of one unit is this worker's alone: no lock needed.
        if isinstance(value, ExceptionWrapper):
            batch.error = batch.error or value
        elif pos >= 0 and value is not None:
            batch.slots[pos] = value
        completed.append(batch)
    if shared_units:
        with shared.lock:
            for batch, pos, value in shared_units:
                if isinstance(value, ExceptionWrapper):
                    if batch.error is None:
                        batch.error = value
                elif pos >= 0 and value is not None:
                    batch.slots[pos] = value
                batch.remaining -= 1
                if batch.remaining == 0:
                    completed.append(batch)
    for batch in completed:
        payload: Any = batch.error
        if payload is None:
            data = batch.slots if cfg.auto_collation and not batch.whole else batch.slots[0]
            payload = _finish(cfg, data, counters, worker_id)
        batch.slots = []  # drop sample references early
        shared.post(batch.gen, batch.idx, worker_id, payload)
        counters.tasks += 1
    return 0.7 * per_unit_s + 0.3 * max(elapsed / len(work), 1e-7)


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
    job = shared.jobs[worker_id].get()
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
    _drain(shared.units)
    for _ in threads:
        shared.units.put(None)  # one sentinel per worker: each exits on its first
    for jobs in shared.jobs:
        _drain(jobs)
        jobs.put(None)
    _drain(shared.results)
    deadline = time.monotonic() + JOIN_BUDGET_S
    current = threading.current_thread()
    for thread in threads:
        if thread is not current:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


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
        # One unit per task: no batching, or a dataset that fetches whole batches.
        self._whole_tasks = not self._auto_collation or bool(getattr(self._dataset, "__getitems__", None))
        self._stats = LoaderStats()
        device_index = None
        if self._pin_memory and torch.accelerator.is_available():
            device_index = torch.accelerator.current_device_index()
        cfg = _Config(
            dataset=self._dataset,
            kind=self._dataset_kind,
            auto_collation=self._auto_collation,
            collate_fn=self._collate_fn,
            drop_last=self._drop_last,
            base_seed=self._base_seed,
            init_fn=loader.worker_init_fn,
            num_workers=self._num_workers,
            pin=self._pin_memory,
            pin_device=self._pin_memory_device,
            device_index=device_index,
        )
        self._shared = shared = _Shared(self._num_workers)
        self._threads = [
            threading.Thread(target=_worker_main, args=(shared, cfg, i), name=f"threadloader-worker-{i}", daemon=True)
            for i in range(self._num_workers)
        ]
        # Runs on del / garbage collection of this iterator, on explicit
        # shutdown, and at interpreter exit (weakref.finalize's atexit hook).
        self._finalizer = weakref.finalize(self, _stop_threads, shared, self._threads)
        self._stats.bind(shared.counters, self._num_workers)
        for thread in self._threads:
            thread.start()
        self._reset(loader, first_iter=True)
        if plan is not None:
            self._num_yielded = plan.num_yielded

    def __next__(self) -> Any:
        # DataLoader wraps every step in a profiler record_function, even when
        # no profiler runs. Its exit op releases the GIL, and with busy worker
        # threads the consumer then waits for the GIL on every item. Keep the
        # profiler range when a profiler is active; skip it otherwise.
        if profiler_enabled():
            return super().__next__()
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
        self._task_info: dict[int, int] = {}  # task -> assigned worker (-1: any)
        self._task_items: dict[int, int] = {}  # task -> number of samples asked for
        self._tasks_outstanding = 0
        self._workers_status = [True] * self._num_workers
        self._workers_num_tasks = [0] * self._num_workers
        self._worker_queue_idx_cycle = itertools.cycle(range(self._num_workers))
        self._stash: dict[int, tuple[int, Any]] = {}  # results received ahead of their turn
        if not first_iter:
            shared = self._shared
            shared.generation += 1  # results of the old epoch are dropped on arrival
            _drain(shared.units)
            for jobs in shared.jobs:
                _drain(jobs)
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
        shared = self._shared
        if self._is_iterable:
            for _ in range(self._num_workers):  # the next active worker, as DataLoader picks it
                worker_id = next(self._worker_queue_idx_cycle)
                if self._workers_status[worker_id]:
                    if self._in_order or self._workers_num_tasks[worker_id] < max_tasks // sum(self._workers_status):
                        break
            else:
                return
            shared.jobs[worker_id].put((idx, shared.generation, index))
            self._workers_num_tasks[worker_id] += 1
        else:
            worker_id = -1
            if self._whole_tasks:
                n_units = 1
            else:
                if not isinstance(index, (list, tuple)):
                    index = list(index)  # a batch sampler may yield any iterable of indices
                n_units = len(index)
            batch = _Batch(idx, shared.generation, index, n_units, self._whole_tasks)
            if n_units == 1:
                shared.units.put((batch, 0))
            elif n_units == 0:
                # An empty index list still goes through collate_fn, as in
                # DataLoader (whose default_collate then raises).
                shared.units.put((batch, -1))
            else:
                for pos in range(n_units):
                    shared.units.put((batch, pos))
        self._task_info[idx] = worker_id
        self._task_items[idx] = len(index) if self._auto_collation and hasattr(index, "__len__") else 1
        self._tasks_outstanding += 1
        self._send_idx += 1

    def _next_data(self) -> Any:
        while True:
            while self._rcvd_idx < self._send_idx:
                worker_id = self._task_info.get(self._rcvd_idx, _MISSING)
                if worker_id is not _MISSING:
                    if worker_id < 0 or self._workers_status[worker_id] or self._has_result(self._rcvd_idx):
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
            if worker_id >= 0:
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
        results = self._shared.results
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
                if kind == _DIED:
                    raise RuntimeError(
                        f"DataLoader worker (thread {worker_id}) exited unexpectedly: {payload!r}") from payload
                if gen != self._shared.generation:
                    continue  # from an epoch that was abandoned
                if kind == _STOPPED or not self._in_order or idx == self._rcvd_idx:
                    return kind, idx, worker_id, payload
                self._stash[idx] = (worker_id, payload)
        finally:
            self._stats.waited(time.perf_counter() - t0)

    def _shutdown_workers(self) -> None:
        self._finalizer()

    @property
    def _workers(self) -> list[WorkerThreadView]:
        """Process-like views of the worker threads (DataLoader's iterator has ``_workers``)."""
        return [WorkerThreadView(t) for t in self._threads]

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
