"""The consumer side of the thread engine: the iterator that drives a pool of workers.

The consumer (the thread iterating the loader) drives everything, exactly as
DataLoader's main process does: it pulls indices from the sampler, assigns each
task (a batch, or one sample without batching) to a worker in DataLoader's
round-robin order, keeps at most ``prefetch_factor * num_workers`` tasks in
flight, and releases results in sampler order (or as ready with
``in_order=False``). Because sampler iteration stays on the consumer thread,
samplers need not be thread-safe and the global RNG is consumed exactly as
DataLoader consumes it. Keeping DataLoader's assignment (task i goes to worker
i mod num_workers while all are active) is what makes per-worker randomness
reproducible: each worker draws from its own generators in the same order as
the worker process with the same id would.

The consumer talks to its workers through a *pool* (:class:`.protocol.Pool`):
it submits :class:`.protocol.Job` s and reads :class:`.protocol.Message` s.
The loader hands the iterator a factory of one:
:func:`threadloader.engine.thread_pool.start_thread_pool` (threads of this process, the
default) or the process layer's (the same threads spread over child processes,
``worker_processes``), which the engine never imports. Neither the threads nor
the pool reference the iterator object, so dropping the iterator (``del``,
garbage collection) runs its finalizer, which stops the pool.
"""

from __future__ import annotations

import itertools
import os
import queue
import time
import weakref
from typing import Any, Callable, NoReturn

import torch
from torch.autograd.profiler import record_function

from .._platform import fork as _fork
from .._platform.torch_compat import (
    BaseDataLoaderIter,
    DatasetKind,
    ExceptionWrapper,
    init_base_iterator,
    profiler_enabled,
    warn_iterable_length,
)
from ..resume import EpochStart, RecordsProgressOnDrop, ResumePlan, dataset_has_state, progress_record
from ..stats.counters import LoaderStats
from ..worker.datapipes import graph_lock, is_datapipe, peek_shared_seed, sharding_init_fn
from . import hooks
from .protocol import (
    ITER_TASK,
    SYNC_TASK,
    Adapts,
    Job,
    Kind,
    Message,
    Pool,
    PoolFactory,
    ProcessDeath,
    ShortBatch,
    Stated,
    WorkerConfig,
)
from .thread_pool import start_thread_pool
from .worker_loop import samples_in

__all__ = ["ThreadedLoaderIter"]


def _stop_pool(pool: Pool, release_hooks: Callable[[], None] | None, stats: LoaderStats) -> None:
    """Stop the iterator's pool, then end what its iterator hooks started.

    The epoch's clock stops too: an iterator dropped after ``break`` ends there.
    """
    stats.ended()
    try:
        pool.stop()
    finally:
        if release_hooks is not None:
            release_hooks()


# --- consumer side ---------------------------------------------------------------

def _get_or_none(results: Any, timeout: float) -> Message | None:
    """The next message within ``timeout`` seconds, or None."""
    try:
        return results.get(timeout=timeout)
    except queue.Empty:
        return None

_MISSING = object()


class ThreadedLoaderIter(RecordsProgressOnDrop, BaseDataLoaderIter):
    """DataLoader's iterator protocol, served by worker threads.

    Args:
        loader: the ThreadDataLoader iterated.
        plan: where a resumed epoch starts (None: a fresh one).
        pool_factory: makes the pool the workers run in (default: threads of this process).
    """

    def __init__(self, loader: Any, plan: ResumePlan | None = None,
                 pool_factory: PoolFactory = start_thread_pool) -> None:
        with graph_lock(loader.dataset):  # it seeds a DataPipe's graph: not while a worker walks one
            init_base_iterator(self, loader)
        #: The process whose threads (or worker processes) serve this iterator.
        self.owner_pid = os.getpid()
        self._owner_forks = _fork.forks  # what next() checks, per batch, for a forked copy
        if plan is not None:
            # Replay the interrupted epoch: its base seed, then its random
            # states, so the sampler draws exactly what it drew then.
            self._base_seed = plan.start.base_seed
            plan.start.apply(loader)
            self._epoch_start = plan.start
            if self._shared_seed is not None:
                # A DataPipe's seed: the one drawn before the epoch's start was
                # captured (an iterator's first epoch), or else the one the
                # epoch drew first from there, in DataLoader's _reset (rank
                # 0's, under torch.distributed: every rank resumes here).
                if plan.start.shared_seed is None:
                    plan.start.shared_seed = peek_shared_seed(loader.generator, self._pg)
                self._shared_seed = plan.start.shared_seed
        else:
            self._epoch_start = EpochStart.capture(loader, self._base_seed, shared_seed=self._shared_seed)
        self._plan = plan
        self._prefetch_factor = loader.prefetch_factor
        self._in_order = loader.in_order
        if self._num_workers <= 0:
            # DataLoader's words, its iterator's name included: a user may match on them.
            raise AssertionError("num_workers must be greater than 0 for MultiProcessingDataLoaderIter")
        if self._prefetch_factor <= 0:
            raise AssertionError("prefetch_factor must be greater than 0 for MultiProcessingDataLoaderIter")
        self._is_iterable = self._dataset_kind == DatasetKind.Iterable
        # A dataset with its own state: each worker's copy's state comes with
        # its results. By worker: the latest state that arrived (any epoch),
        # and the state after the worker's last batch received this epoch.
        self._track_state = dataset_has_state(loader.dataset) and not is_datapipe(loader.dataset)
        self._arrived_states: dict[int, Any] = {}
        self._received_states: dict[int, Any] = {}
        # Each copy's state when this epoch started (None: made from the loader's dataset).
        self._start_states: list[Any] | None = None
        if plan is not None and plan.worker_states is not None:
            self._start_states = list(plan.worker_states)
            self._arrived_states = {w: st for w, st in enumerate(plan.worker_states) if st is not None}
        # An IterableDataset's copies, this epoch: each one's state right after
        # its __iter__ (see ResumePlan.iter_states). A resumed epoch keeps the
        # interrupted one's records until its workers pass them.
        self._iter_states: dict[int, Any] = {}
        if plan is not None:
            self._iter_states = {w: st for w, st in enumerate(plan.iter_states or ()) if st is not None}
            self._received_states = {w: st for w, st in enumerate(plan.resume_states or ()) if st is not None}
        self._stats = LoaderStats()
        device_index = None
        if self._pin_memory and torch.accelerator.is_available():
            device_index = torch.accelerator.current_device_index()
        cfg = WorkerConfig(
            dataset=self._dataset,
            kind=self._dataset_kind,
            auto_collation=self._auto_collation,
            collate_fn=self._collate_fn,
            drop_last=self._drop_last,
            base_seed=self._base_seed,
            # DataLoader shards a DataPipe in a worker_init_fn of its own, run before the user's.
            init_fn=(sharding_init_fn(loader.worker_init_fn, self._world_size, self._rank)
                     if is_datapipe(self._dataset) else loader.worker_init_fn),
            num_workers=self._num_workers,
            pin=self._pin_memory,
            pin_device=self._pin_memory_device,
            device_index=device_index,
            items_per_task=(loader.batch_size or 1) if self._auto_collation else 1,
            shared_seed=self._shared_seed,
            track_state=self._track_state,
            worker_states=plan.worker_states if plan is not None else None,
            iter_states=plan.iter_states if plan is not None and self._is_iterable else None,
            resume_states=plan.resume_states if plan is not None and self._is_iterable else None,
        )
        self._failure: str | None = None
        self._shutdown = False  # DataLoader's iterator attribute: True once its workers are shut down
        self._pool: Pool = pool_factory(cfg)
        release = None
        if self._pool.in_process:
            # What the layers above keep while this iterator's workers run here
            # (the image path's batch buffers: threadloader.engine.hooks).
            try:
                release = hooks.start_iterator(self._prefetch_factor * self._num_workers, self._pin_memory)
            except BaseException:
                self._pool.stop()
                raise
        # Runs on del / garbage collection of this iterator, on explicit
        # shutdown, and at interpreter exit (weakref.finalize's atexit hook).
        self._finalizer = weakref.finalize(self, _stop_pool, self._pool, release, self._stats)
        pool = self._pool
        #: The pool's generation (only this iterator starts new ones: see ``_reset``).
        self._generation = pool.generation
        adapts = isinstance(pool, Adapts)
        self._stats.bind(pool.counters, self._num_workers, pool.on_gil_bound if adapts else None)
        if adapts:
            pool.on_long_wait(self._stats.look)
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
        if self._owner_forks != _fork.forks:
            # A forked process's copy: no worker would ever answer it here.
            raise RuntimeError(f"this DataLoader iterator's workers are those of process {self.owner_pid}, "
                               "not of this forked one: call iter(loader) here")
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
        if first_iter:
            # Workers gone for good: ended by a BaseException (None), or with
            # their worker process (that death).
            self._dead_workers: dict[int, ProcessDeath | None] = {}
        else:  # a persistent iterator's next epoch
            try:
                self._await_workers()
                if self._dead_workers:
                    # Their tasks would never be served. DataLoader's next epoch
                    # finds its dead worker process the same way.
                    raise self._refusal()
            except BaseException:
                # DataLoader's _reset begins the new epoch before it waits for
                # its workers: refused there, its iterator is at an epoch with
                # no task sent, and next() ends it. The abandoned epoch's
                # results are gone (the wait dropped them): none is waited for.
                self._drop_epoch()
                raise
            self._plan = None
            self._epoch_start = EpochStart.capture(loader, self._base_seed)
            # Persistent workers' copies go on from where the last epoch left them.
            self._start_states = self._epoch_start.worker_states = self._copies_states()
            self._received_states, self._iter_states = {}, {}
        with graph_lock(self._dataset):  # it reseeds a DataPipe's graph
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
        self._stash: dict[int, Message] = {}  # results received ahead of their turn
        # IterableDataset: results received per worker this epoch, and how many
        # of each worker's first ones a resumed epoch drops.
        self._worker_received = [0] * self._num_workers
        self._worker_skip = [0] * self._num_workers
        if self._plan is not None and self._is_iterable:
            self._worker_skip = self._plan.worker_skips(self._num_workers)
        self._sampler_done = False
        self._deaths: dict[int, RuntimeError] = {}  # worker -> its death, not raised yet
        if not first_iter:
            # Results of the old epoch are dropped on arrival. super()._reset
            # drew a DataPipe's seed for this epoch (None for other datasets).
            self._pool.new_epoch(seed=self._shared_seed)
            self._generation = self._pool.generation
            self._stats.new_epoch(self._generation)
            if self._track_state and self._is_iterable:
                self._await_iterators()
        elif self._track_state and self._is_iterable and self._plan is not None and self._plan.iter_states is not None:
            self._await_iterators()  # a resume: which copies go on from their checkpointed state
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
                self._sampler_done = True
                return
            idx = self._send_idx
            if self._plan is None or self._is_iterable or not self._plan.skips(idx):
                break
            # Received before the checkpoint: skip it without fetching. The
            # task number stays taken, so later tasks keep their numbers, and
            # its worker's turn passes: each later task goes to the worker
            # (and the dataset copy's state) that served it then.
            self._send_idx += 1
            if self._in_order:
                next(self._worker_queue_idx_cycle)
        for _ in range(self._num_workers):  # the next active worker, as DataLoader picks it
            worker_id = next(self._worker_queue_idx_cycle)
            if self._workers_status[worker_id]:
                if self._in_order or self._workers_num_tasks[worker_id] < max_tasks // sum(self._workers_status):
                    break
        else:
            return
        if (self._auto_collation and not self._is_iterable and not hasattr(index, "__len__")
                and hasattr(index, "__iter__")):
            # A batch sampler may yield an iterator: read it here, on the
            # consumer thread. Anything sized (an array, a tensor, a range)
            # reaches the dataset as the sampler made it, as in DataLoader;
            # so does a bad index (an int): the worker's fetch raises on it,
            # and that task's error comes in its turn, as in DataLoader.
            index = list(index)
        pool = self._pool
        pool.submit(worker_id, Job(idx, self._generation, index))
        self._workers_num_tasks[worker_id] += 1
        self._task_info[idx] = worker_id
        self._task_items[idx] = samples_in(index) if self._auto_collation else 1
        self._tasks_outstanding += 1
        self._send_idx += 1

    def _next_data(self) -> Any:
        if self._failure is not None:  # a worker process died: the workers are gone
            raise RuntimeError(self._failure)
        while True:
            while self._rcvd_idx < self._send_idx:
                worker_id = self._task_info.get(self._rcvd_idx, _MISSING)
                death = None
                if worker_id is not _MISSING:
                    if self._workers_status[worker_id] or self._has_result(self._rcvd_idx):
                        break
                    del self._task_info[self._rcvd_idx]
                    self._task_items.pop(self._rcvd_idx, None)
                    death = self._take_death(worker_id)
                self._consumed_ahead.discard(self._rcvd_idx)  # passed: no longer "ahead"
                self._rcvd_idx += 1
                if death is not None:
                    # The first task a dead worker leaves undone is where
                    # DataLoader notices the death; the next call goes on with
                    # the other workers' tasks.
                    raise death
            else:
                if self._deaths:  # a worker died without a task of its own left
                    raise self._take_death(next(iter(self._deaths)))
                self._finished = True
                self._stats.ended()
                if not self._persistent_workers:
                    self._shutdown_workers()
                raise StopIteration
            message = self._wait_for_result()
            kind, idx, worker_id, payload = message.kind, message.task, message.worker_id, message.payload
            if kind == Kind.DIED:
                continue  # the loop above skips its tasks and raises its error
            self._tasks_outstanding -= 1
            if kind == Kind.STOPPED:
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
            if type(payload) is Stated:
                self._received_states[worker_id] = payload.state
                if payload.iter_state is not None:
                    self._iter_states.setdefault(worker_id, payload.iter_state)
                if payload.went_on and self._is_iterable:
                    # The copy loaded its checkpointed state: its batches come
                    # after the received ones, none is to be dropped.
                    self._worker_received[worker_id] += self._worker_skip[worker_id]
                    self._worker_skip[worker_id] = 0
                payload = payload.payload
            if self._is_iterable:
                self._worker_received[worker_id] += 1
                if self._worker_skip[worker_id] > 0:
                    # One of this worker's batches received before the
                    # checkpoint. Counted per worker, not by task number:
                    # a replica's batches come in its own order, while which
                    # worker serves which task depends on timing when
                    # in_order=False.
                    self._worker_skip[worker_id] -= 1
                    continue
            if type(payload) is ShortBatch:
                items, payload = payload.items, payload.batch
            if isinstance(payload, ExceptionWrapper):
                payload.reraise()
            self._stats.delivered(items)
            return payload

    # helpers ----------------------------------------------------------------------
    def _await_workers(self) -> None:
        """Wait until every live worker has run the jobs queued before now, as DataLoader's next epoch does.

        A persistent iterator's workers may still run an abandoned epoch's
        tasks (after a ``break``): their results are dropped. A worker that
        dies meanwhile is recorded, so that the new epoch is refused, as
        DataLoader refuses it, before any batch, whatever the timing.

        Raises:
            RuntimeError: a worker process crashed, or ``timeout`` passed.
        """
        self._round_trip(SYNC_TASK, lambda message: None)

    def _await_iterators(self) -> None:
        """Have every live worker begin the new epoch's replica and record its copy's state then.

        A checkpoint of this epoch holds it before any batch arrived (see
        ResumePlan.iter_states), as StatefulDataLoader's workers acknowledge
        a new epoch with their state.

        Raises:
            RuntimeError: a worker process crashed, or ``timeout`` passed.
        """
        went_on: set[int] = set()

        def answered(message: Message) -> None:
            payload = message.payload
            if type(payload) is Stated and payload.iter_state is not None:
                self._iter_states.setdefault(message.worker_id, payload.iter_state)
            if type(payload) is Stated and payload.went_on:
                went_on.add(message.worker_id)

        self._round_trip(ITER_TASK, answered)
        if not went_on:
            return
        # Copies that loaded their checkpointed state: none of their batches
        # is read again. When all did, the round robin goes on where it was.
        if went_on == set(range(self._num_workers)) and self._in_order:
            for _ in range(sum(self._worker_skip)):
                next(self._worker_queue_idx_cycle)
        for w in went_on:
            self._worker_received[w] += self._worker_skip[w]
            self._worker_skip[w] = 0

    def _round_trip(self, task: int, answered: Callable[[Message], None]) -> None:
        """Send every live worker the control job ``task``; wait for each one's ``Kind.SYNCED`` answer.

        Other messages are dropped, but deaths: a worker that dies meanwhile
        is waited for no more, and is marked dead as a death anywhere is
        (see _mark_dead), as DataLoader marks a worker found dead while it
        waits for its workers' answers.

        Args:
            task: ``SYNC_TASK`` or ``ITER_TASK``.
            answered: called with each worker's answer, as it arrives.

        Raises:
            RuntimeError: a worker process crashed, or ``timeout`` passed
                (``timeout`` bounds each wait, as DataLoader's).
        """
        pool = self._pool
        waiting = set(range(self._num_workers)) - set(self._dead_workers)
        for worker_id in sorted(waiting):
            pool.submit(worker_id, Job(task, pool.generation, None))
        while waiting:
            message = self._get_message(self._deadline())
            kind = message.kind
            if kind == Kind.SYNCED and message.task == task and message.generation == pool.generation:
                waiting.discard(message.worker_id)
                answered(message)
            elif kind == Kind.DIED:
                waiting.difference_update(self._mark_dead(message))
            elif kind == Kind.CRASHED:
                self._crashed(message.payload)

    def _mark_dead(self, message: Message) -> tuple[int, ...]:
        """Mark the workers a ``Kind.DIED`` message names unavailable, their death to be raised once.

        As DataLoader does with a dead worker process: the worker is
        unavailable from now on, its tasks are skipped, and the error is
        raised where its next task was due (or, a persistent iterator's next
        epoch, as the epoch's refusal).

        Returns:
            The dead workers.
        """
        error, dead = self._record_death(message.worker_id, message.payload)
        for w in dead:
            self._workers_status[w] = False
            self._deaths[w] = error
        return dead

    def _drop_epoch(self) -> None:
        """Leave this epoch with nothing to wait for: the next ``next()`` ends it (StopIteration)."""
        self._task_info.clear()
        self._task_items.clear()
        self._stash.clear()
        self._deaths.clear()
        self._tasks_outstanding = 0
        self._rcvd_idx = self._send_idx
        self._sampler_done = True

    def _deadline(self) -> float | None:
        return None if self._timeout <= 0 else time.monotonic() + self._timeout

    def _copies_states(self) -> list[Any] | None:
        """Each worker's dataset copy's latest state, by worker id, or None: none came (the loader's dataset's).

        Read between epochs, once every worker has answered: the latest state
        that arrived is the copy's own.
        """
        if not (self._track_state and self._arrived_states):
            return None
        return [self._arrived_states.get(w) for w in range(self._num_workers)]

    def next_epoch_worker_states(self) -> list[Any] | None:
        """The dataset copies' states a persistent iterator's next epoch goes on from, or None (see _copies_states).

        Persistent workers keep their copies from epoch to epoch, as worker
        processes do, while the loader's dataset is never iterated.
        """
        return self._copies_states() if self._persistent_workers else None

    def _get_message(self, deadline: float | None) -> Message:
        """The next message from the workers, waiting until ``deadline`` (None: for ever).

        Raises:
            RuntimeError: DataLoader's timeout error, once the deadline has passed.
        """
        results = self._pool.results
        if deadline is None:
            message = results.get()
        else:
            message = _get_or_none(results, max(0.0, deadline - time.monotonic()))
            if message is None:
                # Raised outside the queue's except block: no queue.Empty as its
                # context, as DataLoader's has none.
                raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")
        if type(message.payload) is Stated:  # of any epoch: the copy's state now, for the next epoch's start
            self._arrived_states[message.worker_id] = message.payload.state
        return message

    def _record_death(self, worker_id: int, payload: Any) -> tuple[RuntimeError, tuple[int, ...]]:
        """Record the workers a ``Kind.DIED`` message names as gone for good.

        Args:
            payload: the BaseException that ended thread ``worker_id``, or the
                :class:`ProcessDeath` of a worker process and all its threads.

        Returns:
            The error to raise for them, once, and the workers.
        """
        if isinstance(payload, ProcessDeath):  # DataLoader's message, as for its dead worker process
            self._dead_workers.update(dict.fromkeys(payload.worker_ids, payload))
            return payload.error(), payload.worker_ids
        error = RuntimeError(f"DataLoader worker (thread {worker_id}) exited unexpectedly: {payload!r}")
        error.__cause__ = payload
        self._dead_workers[worker_id] = None
        return error, (worker_id,)

    def _take_death(self, worker_id: int) -> RuntimeError | None:
        """The death of ``worker_id`` to raise now, if not raised yet.

        The threads of one process die together: their one error is raised
        once, where the first of them was due, as DataLoader raises once for
        its one worker per process.
        """
        death = self._deaths.pop(worker_id, None)
        for other in [w for w, e in self._deaths.items() if e is death]:
            del self._deaths[other]
        return death

    def _refusal(self) -> RuntimeError:
        """Why a persistent iterator with dead workers serves no further epoch."""
        # Every dead worker process, in worker order, as DataLoader names its failed workers.
        processes = sorted({d for d in self._dead_workers.values() if d is not None}, key=lambda d: d.worker_ids)
        if processes:
            return processes[0].error(*processes[1:])
        ids = ", ".join(str(w) for w in sorted(self._dead_workers))
        return RuntimeError(f"DataLoader worker (thread(s) {ids}) exited unexpectedly")

    def _crashed(self, message: str) -> NoReturn:
        """A worker process crashed: the workers are gone for good; raise its error."""
        self._failure = message
        self._shutdown_workers()
        raise RuntimeError(message)

    def _has_result(self, idx: int) -> bool:
        return idx in self._stash

    def _wait_for_result(self) -> Message:
        """The next result to act on."""
        if self._in_order:
            if self._rcvd_idx in self._stash:
                return self._stash.pop(self._rcvd_idx)
        elif self._stash:
            return self._stash.pop(next(iter(self._stash)))  # arrival order
        t0 = time.perf_counter()
        self._stats.waiting(t0)
        try:
            while True:
                # ``timeout`` bounds each wait, as DataLoader's: a message kept
                # for later (ahead of its turn) or dropped starts a new one.
                message = self._get_message(self._deadline())
                kind = message.kind
                if kind == Kind.CRASHED:
                    self._crashed(message.payload)
                if kind == Kind.DIED:
                    # A BaseException (SystemExit, KeyboardInterrupt...) ended the
                    # thread, or its worker process died. As DataLoader does with a
                    # dead worker process: the worker is unavailable from now on,
                    # its tasks are skipped, and the error is raised where its next
                    # task was due.
                    self._mark_dead(message)
                    return message
                if message.generation != self._generation or kind == Kind.SYNCED:
                    continue  # from an epoch that was abandoned, or an unread answer of an aborted sync
                if kind == Kind.STOPPED or not self._in_order or message.task == self._rcvd_idx:
                    return message
                self._stash[message.task] = message
        finally:
            self._stats.waited(time.perf_counter() - t0)

    def _shutdown_workers(self) -> None:
        self._finalizer()
        # As DataLoader's shutdown: every worker is unavailable from now on,
        # so a next() skips the tasks they left undone (and ends the epoch).
        self._workers_status = [False] * self._num_workers
        self._shutdown = True

    @property
    def _workers(self) -> list[Any]:
        """One process-like object per worker, as DataLoader's iterator has ``_workers``."""
        return self._pool.workers

    def progress(self) -> dict[str, Any] | None:
        """This epoch's checkpoint record, or None once the epoch is over.

        A map-style epoch whose every batch was received is over even before
        ``next()`` raised StopIteration (a checkpoint at its last batch, as
        Lightning takes one): resuming it starts the next epoch, not an empty
        remainder of this one.
        """
        if self._finished:
            return None
        if (not self._is_iterable and self._sampler_done and self._tasks_outstanding == 0
                and not self._stash and not self._deaths):
            return None
        prefix, received = self._rcvd_idx, None
        if self._is_iterable:
            # A resumed epoch's batches still to be dropped were received before the checkpoint.
            received = [got + skip for got, skip in zip(self._worker_received, self._worker_skip)]
        elif self._plan is not None:
            # Tasks the resume skips count as received before next() has passed them.
            prefix = max(prefix, self._plan.consumed_prefix)
        extra = [i for i in self._consumed_ahead if i >= prefix]
        states = iter_states = resume_states = None
        workers = range(self._num_workers)
        if self._track_state and not self._is_iterable:
            # Each copy's state after its last received batch: the resume loads
            # it and fetches none of the received ones again.
            start = self._start_states or [None] * self._num_workers
            states = [self._received_states.get(w, start[w]) for w in workers]
        elif self._track_state:
            iter_states = [self._iter_states.get(w) for w in workers]
            resume_states = [self._received_states.get(w) for w in workers]
        return progress_record(self._epoch_start, prefix, extra, self._num_yielded, received, worker_states=states,
                               iter_states=iter_states, resume_states=resume_states)

    @property
    def stats(self) -> LoaderStats:
        """Counters of this iterator (see :class:`threadloader.stats.LoaderStats`)."""
        return self._stats
