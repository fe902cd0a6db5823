"""The worker side of the thread engine: what one worker thread runs.

A worker thread sets itself up as a DataLoader worker (worker info, seeds,
its own shallow copy of the dataset, one intra-op thread), runs
``worker_init_fn``, then serves the tasks the consumer assigns it: for a
map-style dataset it fetches the task's samples in order and collates them,
as a DataLoader worker process does; for an IterableDataset it advances its
own replica iterator. Results, or the exception wrapped with where it
happened, go to the result queue. :class:`_Shared` is all a worker shares with
its pool's owner; nothing here references the iterator.

The same loop runs in this process (:class:`threadloader.engine.thread_pool.ThreadPool`)
and inside ``worker_processes`` children (:mod:`threadloader.procs`).
"""

from __future__ import annotations

import dataclasses
import queue
import time
from typing import Any, Callable, NamedTuple

import torch

from .._platform.interpreter import FREE_THREADED_BUILD
from .._platform.torch_compat import DatasetKind, ExceptionWrapper, create_fetcher, pin_memory
from ..resume import dataset_state_of, same_state
from ..stats.counters import WorkerCounters
from ..worker import context as _context
from ..worker import handoff as _handoff
from ..worker import info as worker
from ..worker.copies import WorkerParts
from ..worker.datapipes import seed_graph
from ..worker.intraop import limit_this_thread
from . import hooks
from .protocol import ITER_TASK, PARK_TASK, SYNC_TASK, Job, Kind, Message, ShortBatch, Stated, WorkerConfig

#: On a free-threaded build, how often an idle worker thread wakes to free
#: the objects it made that other threads have dropped (see ``next_job``).
IDLE_WAKE_S = 0.05

def _with_state(cfg: WorkerConfig, payload: Any) -> Any:
    if not cfg.track_state:
        return payload
    return Stated(payload, dataset_state_of(cfg.dataset, "dataset (a worker's copy)"))


def _load_state(cfg: WorkerConfig, worker_id: int) -> ExceptionWrapper | None:
    """Load this worker's recorded dataset state into its copy (a resume); the error, if it raised."""
    states = cfg.worker_states
    if states is None or worker_id >= len(states) or states[worker_id] is None:
        return None
    try:
        cfg.dataset.load_state_dict(states[worker_id])
    except Exception:
        return ExceptionWrapper(where=_where(worker_id, "dataset.load_state_dict"))
    return None


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
        #: generation -> an iterable DataPipe's shared seed for that epoch (persistent
        #: workers' later epochs); written before the epoch's first job is queued.
        self.epoch_seeds: dict[int, int] = {}

    def new_epoch(self, generation: int | None = None, seed: int | None = None) -> None:
        """Start generation ``generation`` (default: the next one); ``seed``: an iterable DataPipe's for it."""
        self.generation = self.generation + 1 if generation is None else generation
        if seed is not None:
            self.epoch_seeds[self.generation] = seed

    def post(self, gen: int, idx: int, worker_id: int, payload: Any) -> None:
        self.results.put(Message(Kind.DATA, gen, idx, worker_id, payload))

    def next_job(self, worker_id: int) -> Job | None:
        """Wait for the worker's next job (None: stop)."""
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


class Worker(NamedTuple):
    """A worker as :func:`become_worker` set it up."""

    #: What it serves with: the loader's config with its own copies of the dataset and hooks.
    cfg: WorkerConfig
    #: Its set-up's failure, still due to its first task.
    setup: _SetupError


def become_worker(cfg: WorkerConfig, worker_id: int, parts: WorkerParts) -> Worker:
    """Make the calling context worker ``worker_id`` (info, generators) and set it up.

    A fresh worker seeds its DataPipe graph and runs ``worker_init_fn``; one
    handed over (``cfg.handoffs``) takes its generators' states and set-up
    outcome instead, with nothing run again.

    Args:
        parts: the worker's copies of the dataset and hooks.
    """
    cfg = dataclasses.replace(cfg, dataset=parts.dataset, init_fn=parts.init_fn, collate_fn=parts.collate_fn)
    handoff = cfg.handoff(worker_id)
    if cfg.shared_seed is not None and handoff is None:
        # Before worker info and worker_init_fn, as in DataLoader's worker loop.
        seed_graph(cfg.dataset, cfg.shared_seed)
    worker.enter_worker(worker_id, cfg.num_workers, cfg.base_seed, cfg.dataset, process_wide=cfg.owns_process)
    # A worker only ever collates for this loader: tell collate
    # functions (frame_collate) once whether batches get pinned.
    _context.set_collating(cfg.pin)
    if handoff is not None:
        # A worker moved here goes on where it stopped: set up once, as a DataLoader worker.
        _handoff.restore(handoff.rng)
        return Worker(cfg, _SetupError(handoff.setup_error, handoff.setup_gen))
    return Worker(cfg, _SetupError(_set_up(cfg, worker_id)))


def leave_worker() -> None:
    """Undo :func:`become_worker` in the calling context."""
    _context.set_collating(False)
    worker.leave_worker()


def _worker_main(shared: _Shared, cfg: WorkerConfig, worker_id: int, parts: WorkerParts) -> None:
    """Body of one worker thread: set up worker info, init, then serve tasks.

    Args:
        parts: this worker's copies of the dataset and hooks (:func:`threadloader.worker.copies.worker_parts`),
            made by the pool's owner before the epoch drew anything.
    """
    # What the layers above keep for as long as this worker runs (the image
    # path's room for one task's frames: threadloader.engine.hooks).
    release_hooks = hooks.start_worker(cfg.items_per_task)
    try:
        # N workers must not each fan out over torch's intra-op pool.
        limit_this_thread()
        if cfg.pin and cfg.device_index is not None:
            torch.accelerator.set_device_index(cfg.device_index)
        cfg, setup = become_worker(cfg, worker_id, parts)
        if cfg.kind == DatasetKind.Iterable:
            _serve_iterable(shared, cfg, worker_id, setup)
        else:
            _serve_map(shared, cfg, worker_id, setup, parts)
    except BaseException as exc:  # noqa: BLE001 - reported to the consumer, never lost
        if not shared.stopping:
            shared.results.put(Message(Kind.DIED, shared.generation, -1, worker_id, exc))
    finally:
        leave_worker()
        release_hooks()


def _set_up(cfg: WorkerConfig, worker_id: int) -> ExceptionWrapper | None:
    """Run ``worker_init_fn``, then load the worker's recorded state (a resume); the failure, if any."""
    try:
        if cfg.init_fn is not None:
            cfg.init_fn(worker_id)
    except Exception:
        return ExceptionWrapper(where=_where(worker_id, "worker_init_fn"))
    return _load_state(cfg, worker_id)


def _finish(cfg: WorkerConfig, data: Any, counters: WorkerCounters, worker_id: int) -> Any:
    """Collate (when batching) and pin one task's data in this worker.

    Returns:
        The batch, or an ExceptionWrapper naming the step that failed.
    """
    t0 = time.perf_counter()
    try:
        data = cfg.collate_fn(data)
    except Exception as e:
        if isinstance(e, StopIteration) and cfg.kind == DatasetKind.Iterable:
            # Raised inside the replica's fetch, as DataLoader's worker sees it:
            # the end of this worker's replica, not an error.
            raise
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


class _SetupError:
    """A worker's set-up failure (``worker_init_fn``, ``IterableDataset.__iter__``) and the epoch it fails.

    A DataLoader worker process reports it for its first task; when persistent
    workers start a later epoch it builds its fetcher again and serves. Here
    every task of the epoch the failure is first reported in fails with it
    (DataLoader's later tasks there fail with an ``UnboundLocalError``), and
    later epochs are served.
    """

    __slots__ = ("error", "gen")

    def __init__(self, error: ExceptionWrapper | None = None, gen: int | None = None) -> None:
        self.error = error
        self.gen = gen  # the epoch (generation) it fails; None: the first task's

    def for_task(self, gen: int) -> ExceptionWrapper | None:
        """The error a task of generation ``gen`` gets instead of its data, if any."""
        if self.error is None:
            return None
        if self.gen is None:
            self.gen = gen
        elif gen != self.gen:
            self.error = None  # a later epoch
        return self.error


def _serve_map(shared: _Shared, cfg: WorkerConfig, worker_id: int, setup: _SetupError, parts: WorkerParts) -> None:
    while _map_step(shared, cfg, worker_id, setup, parts):
        pass


def _fetch_map(cfg: WorkerConfig, index: Any, worker_id: int) -> Any:
    """The samples of one map-style task, in index order, or an ExceptionWrapper."""
    dataset = cfg.dataset
    if not cfg.auto_collation:
        try:
            return dataset[index]
        except Exception:
            return ExceptionWrapper(where=_where(worker_id, f"dataset index {index!r}"))
    # Asked of this worker's dataset at each fetch, as torch's map fetcher
    # does: a worker_init_fn may give the worker's copy its own __getitems__.
    # Inside the try, as there: a __getattr__ that raises fails the batch.
    try:
        getitems = getattr(dataset, "__getitems__", None)
        if getitems:
            return getitems(index)
    except Exception:
        return ExceptionWrapper(where=_where(worker_id, "__getitems__"))
    data = []
    try:
        for i in index:
            try:
                data.append(dataset[i])
            except Exception:
                return ExceptionWrapper(where=_where(worker_id, f"dataset index {i!r}"))
    except Exception:  # the index itself: an int or a 0-d tensor from a bad batch sampler
        return ExceptionWrapper(where=_where(worker_id, f"batch index {index!r}"))
    return data


def samples_in(index: Any) -> int:
    """The samples a batch index names; 0 for one without a length (an int, a 0-d tensor), whose fetch raises."""
    try:
        return len(index)
    except TypeError:
        return 0


def _next_task(shared: _Shared, counters: WorkerCounters, worker_id: int) -> Job | None:
    """Wait, counted as idle, for the worker's next task, or None: stop.

    ``SYNC_TASK`` jobs are answered here: every job queued before them has run.
    """
    counters.busy = False
    while True:
        job = shared.next_job(worker_id)
        if job is None or shared.stopping:
            return None
        if job.task != SYNC_TASK:
            break
        shared.results.put(Message(Kind.SYNCED, job.generation, SYNC_TASK, worker_id, None))
    counters.busy = True
    return job


def _map_step(shared: _Shared, cfg: WorkerConfig, worker_id: int, setup: _SetupError, parts: WorkerParts) -> bool:
    """Serve one map-style task: fetch its samples, collate, post. False: stop.

    A function of its own so that its locals (samples, the collated batch)
    are released before the worker waits again: an idle persistent worker
    must not keep the last batch alive.
    """
    counters = shared.counters[worker_id]
    job = _next_task(shared, counters, worker_id)
    if job is None:
        return False
    idx, gen, index = job.task, job.generation, job.index
    if idx == PARK_TASK:
        # Idle between two tasks: what it would take to go on elsewhere. It
        # serves on here if it is given more work instead.
        counters.busy = False
        shared.results.put(Message(Kind.PARKED, gen, PARK_TASK, worker_id,
                                   _handoff.capture(parts, setup.error, setup.gen)))
        return True
    # A task of an abandoned epoch (persistent workers) runs all the same, as
    # in a DataLoader worker process: its draws from this worker's random
    # streams must happen whatever the timing. The consumer drops the result.
    failed = setup.for_task(gen)
    if failed is not None:
        shared.post(gen, idx, worker_id, failed)
        return True
    t0 = counters.fetch_since = time.perf_counter()
    try:
        payload = _fetch_map(cfg, index, worker_id)
    finally:
        counters.fetch_since = 0.0  # a BaseException ends the worker, which is busy no more
    counters.fetch_s += time.perf_counter() - t0
    counters.fetched(gen, samples_in(index) if cfg.auto_collation else 1)
    if not isinstance(payload, ExceptionWrapper):
        payload = _finish(cfg, payload, counters, worker_id)
    shared.post(gen, idx, worker_id, _with_state(cfg, payload))
    counters.tasks += 1
    return True


class _Replica:
    """One worker's IterableDataset iterator and where it stands."""

    __slots__ = ("fetcher", "gen", "ended", "setup", "collated", "finish_s", "iter_state", "went_on", "resuming")

    def __init__(self, setup: _SetupError, resuming: bool = False) -> None:
        self.fetcher: Any = None
        self.gen = -1
        self.iter_state: Any = None  # the copy's state after this epoch's __iter__, until posted
        self.went_on = False  # resumed from the checkpointed state (posted with the first result)
        self.resuming = resuming  # the first epoch of a resume, not begun yet
        self.ended = False
        self.setup = setup
        self.collated = 0  # samples in the batch the fetcher collated last
        self.finish_s = 0.0  # seconds its collate (and pin) took, inside the fetch


def _serve_iterable(shared: _Shared, cfg: WorkerConfig, worker_id: int, setup: _SetupError) -> None:
    counters = shared.counters[worker_id]
    replica = _Replica(setup, resuming=cfg.iter_states is not None)

    def collate(data: Any) -> Any:
        replica.collated = len(data) if cfg.auto_collation else 1
        t0 = time.perf_counter()
        out = _finish(cfg, data, counters, worker_id)
        replica.finish_s = time.perf_counter() - t0  # counted as collate, not fetch
        return out  # a failed collate/pin comes back as an ExceptionWrapper: the task's result

    while _iterable_step(shared, cfg, worker_id, replica, collate):
        pass


def _iterable_step(shared: _Shared, cfg: WorkerConfig, worker_id: int, replica: _Replica, collate: Callable) -> bool:
    """Serve one job (a function so that the batch is not kept while idle). False: stop."""
    counters = shared.counters[worker_id]
    job = _next_task(shared, counters, worker_id)
    if job is None:
        return False
    idx, gen, index = job.task, job.generation, job.index
    if idx == ITER_TASK:
        if gen != replica.gen:
            _begin_epoch(shared, cfg, worker_id, replica, gen, collate)  # an error waits for the epoch's first task
        shared.results.put(Message(Kind.SYNCED, gen, ITER_TASK, worker_id, _replica_stated(cfg, None, replica)))
        return True
    failed = replica.setup.for_task(gen)
    if failed is not None:
        shared.post(gen, idx, worker_id, failed)
        return True
    if gen != replica.gen and not _begin_epoch(shared, cfg, worker_id, replica, gen, collate):
        shared.post(gen, idx, worker_id, replica.setup.error)
        return True
    if replica.ended:
        return True  # DataLoader's exhausted workers ignore further tasks
    t0 = counters.fetch_since = time.perf_counter()
    replica.collated, replica.finish_s = 0, 0.0
    try:
        payload = replica.fetcher.fetch(index)
    except StopIteration:
        replica.ended = True
        shared.results.put(Message(Kind.STOPPED, gen, idx, worker_id, _replica_stated(cfg, None, replica)))
        return True
    except Exception:
        payload = ExceptionWrapper(where=_where(worker_id, "IterableDataset"))
    finally:
        counters.fetch_since = 0.0
    # One update: a snapshot read in between never sees a negative fetch time.
    counters.fetch_s += time.perf_counter() - t0 - replica.finish_s
    counters.fetched(gen, replica.collated)
    counters.tasks += 1
    if cfg.auto_collation and 0 < replica.collated < len(index):
        # The replica ran out mid-batch: the consumer's stats count the
        # samples this batch holds, not the batch size it asked for.
        payload = ShortBatch(payload, replica.collated)
    shared.post(gen, idx, worker_id, _replica_stated(cfg, payload, replica))
    return True


def _begin_epoch(shared: _Shared, cfg: WorkerConfig, worker_id: int, replica: _Replica, gen: int,
                 collate: Callable) -> bool:
    """A new epoch (persistent workers): a fresh replica iterator, as DataLoader's workers make on _ResumeIteration.

    Returns:
        False: ``__iter__`` raised; the error is the epoch's (``replica.setup``).
    """
    replica.gen, replica.ended, replica.fetcher = gen, False, None
    try:
        seed = shared.epoch_seeds.get(gen)
        if seed is not None:  # a DataPipe's next epoch: reseeded as on DataLoader's _ResumeIteration
            seed_graph(cfg.dataset, seed)
        replica.fetcher = create_fetcher(cfg.kind, cfg.dataset, cfg.auto_collation, collate, cfg.drop_last)
        if cfg.track_state:
            replica.iter_state = dataset_state_of(cfg.dataset, "dataset (a worker's copy)")
            if replica.resuming:
                replica.resuming = False
                if _goes_on_from_checkpoint(cfg, worker_id, replica.iter_state):
                    replica.fetcher = create_fetcher(cfg.kind, cfg.dataset, cfg.auto_collation, collate, cfg.drop_last)
                    replica.went_on, replica.iter_state = True, None
    except Exception:
        replica.setup = _SetupError(ExceptionWrapper(where=_where(worker_id, "IterableDataset.__iter__")), gen)
        return False
    return True


def _replica_stated(cfg: WorkerConfig, payload: Any, replica: _Replica) -> Any:
    """``payload`` with the copy's state; the epoch's first one also with its state after ``__iter__``."""
    if not cfg.track_state:
        return payload
    stated = Stated(payload, dataset_state_of(cfg.dataset, "dataset (a worker's copy)"), replica.iter_state,
                    replica.went_on)
    replica.iter_state, replica.went_on = None, False
    return stated


def _goes_on_from_checkpoint(cfg: WorkerConfig, worker_id: int, iter_state: Any) -> bool:
    """A resumed IterableDataset copy: load its checkpointed state (True) where reading again would not do.

    Reading the received batches again reproduces them when ``__iter__``
    from the epoch-start state left the copy as it left it in the
    interrupted run. Otherwise (its state is a position, which
    ``load_state_dict`` makes the next ``__iter__`` resume from, as
    StatefulDataLoader expects) the copy loads its state after its last
    received batch and goes on from there.
    """
    recorded = cfg.iter_states[worker_id] if worker_id < len(cfg.iter_states or ()) else None
    resume = cfg.resume_states[worker_id] if worker_id < len(cfg.resume_states or ()) else None
    if recorded is None or same_state(iter_state, recorded):
        return False
    # None received yet: it goes on from where its __iter__ left it.
    cfg.dataset.load_state_dict(recorded if resume is None else resume)
    return True

def _drain(q: queue.SimpleQueue) -> None:
    while True:
        try:
            q.get_nowait()
        except queue.Empty:
            return
