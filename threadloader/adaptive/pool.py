"""The adaptive mode's pool: :class:`AdaptivePool`.

It starts a loader's workers as threads of this process. When their tasks
cost less than handing them to a thread and back (:class:`.policy.HandoffWatch`),
it moves them into the consumer's thread
(:class:`threadloader.engine.inline_pool.InlinePool`). When the loader's
stats find them GIL-bound (busy threads taking turns on one core while cores
stand idle: :mod:`threadloader.stats.gil`) and their tasks cost enough for
processes to pay (:mod:`.policy`), it moves them into child processes, one
worker per process as in DataLoader, in the middle of the epoch:

1. ``move``: each worker's queued jobs are taken back, in order, and a
   ``PARK_TASK`` job is queued instead; new jobs wait here.
2. Each worker finishes the task it is on, then answers ``Kind.PARKED`` with
   its handoff (its copies and generators: :mod:`threadloader.worker.handoff`)
   and waits.
3. A worker that parked while another is still on a slow task does not wait
   for it: once the consumer has waited :data:`GO_ON_AFTER_S` (or four mean
   tasks, if longer) with nothing arriving, each parked worker gets its held
   jobs back and serves on as a thread. When every other worker has parked,
   those park again, after the task each is on. DataLoader's other workers
   serve on while one task takes long (``in_order=False`` shows it), and so
   do these.
4. When the last one has answered (read by the consumer, in :meth:`get`),
   the process pool (or the inline pool) starts with the handoffs: each
   worker goes on where its thread stopped, with no ``worker_init_fn`` run
   again. The jobs taken back and held go to it in their order, and the
   threads stop.

Every worker runs the same jobs in the same order whichever side runs them,
so batches, random streams and errors are those of an unmoved run. If the
processes cannot start, or a worker dies while the others park, the threads
go on with the jobs held and the mode stays threads for good.
"""

from __future__ import annotations

import dataclasses
import heapq
import queue
import threading
import time
import weakref
from typing import Any, Callable, Iterator

from .._platform import thread_origin
from ..engine.inline_pool import InlinePool
from ..engine.protocol import PARK_TASK, STOPPED_MESSAGE, Job, Kind, Message, Mode, ModeReport, Pool, WorkerConfig
from ..engine.thread_pool import ThreadPool
from ..stats.gil import GilBound
from . import policy

__all__ = ["GO_ON_AFTER_S", "AdaptivePool"]

#: While the workers move: how long the consumer waits, with nothing arriving,
#: before the parked workers serve on as threads (at least four mean tasks).
GO_ON_AFTER_S = 0.1

_COUNTED = ("fetch_s", "collate_s", "pin_s", "epoch", "epoch_items", "tasks")


def _in_task_order(held: dict[int, list[Job]]) -> Iterator[tuple[int, Job]]:
    """The held jobs as ``(worker_id, job)``, each worker's in its order, merged in the epochs' task order.

    The inline pool runs jobs in the order it gets them: the consumer's next
    task comes first, and an error or a death surfaces where its task is due.
    """
    def tagged(w: int, jobs: list[Job]) -> Iterator[tuple[int, Job]]:
        return ((w, job) for job in jobs)

    return heapq.merge(*(tagged(w, jobs) for w, jobs in held.items()),
                       key=lambda item: (item[1].generation, item[1].task))


class AdaptivePool:
    """A :class:`~threadloader.engine.protocol.Pool` whose worker threads move into processes when they hold the GIL.

    Args:
        cfg: what every worker needs (a map-style dataset: see :func:`.policy.ineligible`).
        report: the loader's mode report, updated here when the mode changes.
        start_processes: starts the process pool the workers move into,
            given ``cfg`` with their handoffs (one worker per process).
        inline_blocked: why the workers may not move into the consumer's
            thread (:func:`.policy.inline_ineligible`), or None: they may.
    """

    def __init__(self, cfg: WorkerConfig, report: ModeReport, start_processes: Callable[[WorkerConfig], Pool],
                 inline_blocked: str | None = None) -> None:
        # Before any thread starts: they may raise.
        self._move_after = policy.forced_move_after()
        inline_after = policy.forced_inline_after()
        #: Where the workers go when they move.
        self._target = Mode.PROCESSES
        if inline_after is not None and inline_blocked is None:
            self._move_after, self._target = inline_after, Mode.INLINE
        self._cfg = cfg
        self._report = report
        self._start_processes = start_processes
        thread_origin.watch()  # before the workers start: the threads they start are told apart
        self._threads = ThreadPool(cfg, list(range(cfg.num_workers)))
        self._current: Pool = self._threads
        #: The workers' counters by id; the processes' replace them here when the workers move.
        self.counters = list(self._threads.counters)
        #: While moving: the jobs held back of each worker parking or parked, in order (None: not moving).
        self._held: dict[int, list[Job]] | None = None
        self._parked: dict[int, Any] = {}
        #: While moving: the workers that parked, then went on as threads while another was on a slow task.
        self._went_on: set[int] = set()
        self._gave_up = False  # a move failed: threads for good
        self._stopped = False
        # The consumer moves the pool (in get); a garbage collection may stop it from another thread.
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._verdict: GilBound | None = None
        #: Watches whether the tasks cost less than their hand-offs (None: not watched).
        self._watch: policy.HandoffWatch | policy.InlineWatch | None = (
            policy.HandoffWatch(self._threads.counters) if inline_blocked is None and self._move_after is None else None)
        self._watch_seen: policy.HandoffWatch | None = None  # the look that moved them into the consumer's thread
        self._delivered = 0
        #: The GIL check, run while the consumer waits long on threads (None: not asked).
        self._look: weakref.WeakMethod | None = None
        if self._move_after == 0:
            self._move_after = None
            self.move(self._target)

    # --- Pool ---------------------------------------------------------------------
    @property
    def results(self) -> AdaptivePool:
        """Where the consumer reads messages: this pool's :meth:`get`."""
        return self

    @property
    def in_process(self) -> bool:
        return self._current.in_process

    @property
    def generation(self) -> int:
        return self._current.generation

    @property
    def replicas(self) -> Any:
        return self._current.replicas

    @property
    def workers(self) -> list[Any]:
        return self._current.workers

    def submit(self, worker_id: int, job: Job) -> None:
        """Queue ``job`` for worker ``worker_id`` (held while the workers move).

        Raises:
            RuntimeError: the pool was stopped.
        """
        if self._stopped:
            raise RuntimeError(STOPPED_MESSAGE)
        held = self._held
        if held is not None and worker_id in held:
            held[worker_id].append(job)
            return
        self._current.submit(worker_id, job)

    def new_epoch(self, generation: int | None = None, seed: int | None = None) -> None:
        """Start a new generation (see ``ThreadPool.new_epoch``); the processes take it from the threads when they start."""
        self._current.new_epoch(generation, seed)

    def stop(self) -> None:
        """Stop the workers, threads and processes (idempotent)."""
        with self._lock:
            self._stopped = True
            self._held = None
            self._threads.stop()
            if self._current is not self._threads:
                self._current.stop()

    def on_long_wait(self, look: Callable[[], None]) -> None:
        """Call ``look`` (a bound method, held weakly) every :data:`.policy.LOOK_EVERY_S` the consumer waits on threads."""
        self._look = weakref.WeakMethod(look)  # type: ignore[arg-type]

    # --- the move -----------------------------------------------------------------
    def on_gil_bound(self, verdict: GilBound) -> bool:
        """Move the workers into processes if that pays (True: acted on, no warning)."""
        if self._held is not None or isinstance(self._current, InlinePool):
            return True  # moving, or the consumer runs the tasks: nothing to warn of
        if self._current is not self._threads or self._gave_up or self._stopped:
            return False
        if not policy.worth_moving(verdict):
            self._report.reason = (
                f"adaptive: the workers look GIL-bound, but a task costs {verdict.task_cpu_s * 1e3:.2f} ms of CPU, "
                f"too little for processes to pay (from {policy.MIN_TASK_CPU_S * 1e3:g} ms)"
            )
            return False
        self._verdict = verdict
        return self.move(Mode.PROCESSES)

    def move(self, target: Mode = Mode.PROCESSES) -> bool:
        """Begin moving the workers into processes, or into the consumer's thread: they park after the task each is on.

        Args:
            target: ``Mode.PROCESSES`` or ``Mode.INLINE``.

        Returns:
            False: a worker thread has ended (it died), so they stay threads.
        """
        with self._lock:
            if self._stopped or self._held is not None or self._current is not self._threads:
                return self._held is not None
            if not all(thread.is_alive() for thread in self._threads.threads):
                self._give_up("a worker thread had died")
                return False
            self._target = target
            self._watch = None
            strangers = self._threads_started_by_workers() if target is Mode.PROCESSES else []
            if strangers:
                self._give_up(f"threads the workers started ({', '.join(strangers)}) would be "
                              "missing in a worker process")
                return False
            self._parked, self._went_on = {}, set()
            self._held = {}
            self._park(self._held, range(self._cfg.num_workers))
            return True

    def _park(self, held: dict[int, list[Job]], workers: Any) -> None:
        """Hold the queued jobs of ``workers`` in ``held`` and have each park after the task it is on (lock held)."""
        for w in workers:
            held[w] = self._threads.take_queued(w)
            self._threads.submit(w, Job(PARK_TASK, self._threads.generation, None))

    def _patience(self) -> float:
        """How long the consumer waits for a message, while the workers move, before the parked ones go on."""
        tasks = sum(c.tasks for c in self._threads.counters)
        busy_s = sum(c.fetch_s + c.collate_s for c in self._threads.counters)
        return max(GO_ON_AFTER_S, 4 * busy_s / tasks) if tasks else GO_ON_AFTER_S

    def _go_on(self) -> None:
        """The consumer waits in vain: parked workers serve on as threads while another finishes a slow task."""
        with self._lock:
            held = self._held
            if held is None or self._stopped:
                return
            for w in list(self._parked):
                del self._parked[w]
                self._went_on.add(w)
                for job in held.pop(w):
                    self._threads.submit(w, job)

    def _on_parked(self, worker_id: int, handoff: Any) -> None:
        """Record ``worker_id``'s handoff; the last one completes the move."""
        with self._lock:
            held = self._held
            if held is None or worker_id not in held or self._stopped:
                return  # a park of a move given up
            self._parked[worker_id] = handoff
            if self._went_on and len(self._parked) + len(self._went_on) == self._cfg.num_workers:
                went_on, self._went_on = self._went_on, set()
                self._park(held, sorted(went_on))  # their handoffs are stale: they park again
            if len(self._parked) < self._cfg.num_workers:
                return
        self._finish_move()

    def _threads_started_by_workers(self) -> list[str]:
        """The live Python threads that the worker threads started (threadloader's own aside).

        A dataset or ``worker_init_fn`` may start threads (an executor, a
        prefetcher); in a forked process they would be gone and the worker
        would wait on them for ever. Threads the training loop starts do not
        matter to the workers.
        """
        return sorted(t.name for t in thread_origin.started_within(self._threads.threads)
                      if not t.name.startswith("threadloader-"))

    def get(self, block: bool = True, timeout: float | None = None) -> Message:
        """The next message for the consumer (``queue.SimpleQueue.get``'s arguments and ``queue.Empty``).

        Parked workers' answers are taken here; the last one completes the move.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._held is None and self._move_after is None:
            # Not moving, no forced move to count (the consumer's path per batch):
            # only a late park answer, or a look at the hand-offs' cost, needs this pool.
            watch = self._watch
            t0 = time.perf_counter() if watch is not None else 0.0
            if block and self._look is not None and self._current is self._threads:
                message = self._wait_on_threads(deadline)
            else:
                message = self._current.results.get(block, timeout)
            if message is not None:
                if watch is not None and watch.add(time.perf_counter() - t0):
                    self._act_on(watch)
                if message.kind is not Kind.PARKED:
                    return message
                self._on_parked(message.worker_id, message.payload)
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if self._held is not None and block:
                patience = self._patience()
                try:
                    message = self._current.results.get(True, patience if remaining is None else min(patience, remaining))
                except queue.Empty:
                    if remaining is not None and remaining <= patience:
                        raise
                    self._go_on()
                    continue
            else:
                message = self._current.results.get(block, remaining)
            if message.kind == Kind.PARKED:
                moving = self._held is not None
                self._on_parked(message.worker_id, message.payload)
                if moving and self._held is None and timeout is not None:
                    # The wait for the workers starts again: starting processes is ours.
                    deadline = time.monotonic() + timeout
                continue
            if message.kind == Kind.DIED and self._held is not None:
                self._abort_move(f"worker {message.worker_id} died while the workers moved")
            elif self._move_after is not None and message.kind == Kind.DATA:
                self._delivered += 1
                if self._delivered >= self._move_after:
                    self._move_after = None
                    self.move(self._target)
            return message

    def _wait_on_threads(self, deadline: float | None) -> Message | None:
        """The worker threads' next message, the GIL check asked to look while none arrives; None: they began to move.

        Raises:
            queue.Empty: none came by ``deadline``.
        """
        results = self._threads.results
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            step = policy.LOOK_EVERY_S if remaining is None else min(policy.LOOK_EVERY_S, remaining)
            try:
                return results.get(True, step)
            except queue.Empty:
                if remaining is not None and remaining <= step:
                    raise
            look = self._look() if self._look is not None else None
            if look is not None:
                look()
            if self._held is not None:
                return None

    def _finish_move(self) -> None:
        """Every worker has parked: start the processes with their handoffs, hand them the held jobs."""
        with self._lock:
            if self._held is None or self._stopped:
                return
            cfg = dataclasses.replace(self._cfg, handoffs=dict(self._parked), worker_states=None)
            inline = self._target is Mode.INLINE
            try:
                processes = InlinePool(cfg, self._threads.caller) if inline else self._start_processes(cfg)
            except Exception as e:  # noqa: BLE001 - the threads go on: nothing is lost
                where = "the workers in the consumer's thread" if inline else "the worker processes"
                self._abort_move_locked(f"starting {where} failed: {e!r}")
                return
            threads = self._threads
            held, self._held, self._parked = self._held, None, {}
            self._go_on_in(processes, threads, held)
            # The consumer's thread is tried each epoch (later iterators start on threads) and
            # left if its tasks grow dear; processes are final.
            self._report.mode, self._report.reason = self._target, self._moved_reason()
            self._report.settled = self._target is Mode.PROCESSES
            if self._target is Mode.INLINE and self._watch_seen is not None:
                self._watch = policy.InlineWatch(self._watch_seen.wait_s)
        # Idle: they end at once. Their copies here are retired (the children
        # have theirs), unless the workers go on with them in the consumer's thread.
        threads.stop(keep_copies=self._target is Mode.INLINE)

    def _go_on_in(self, new: Pool, old: Pool, held: dict[int, list[Job]]) -> None:
        """``new`` takes over from ``old`` (lock held): the epoch's totals, its generation, and the held jobs.

        From here stop() stops ``new`` too, whatever fails next.
        """
        self._current = new
        for before, after in zip(old.counters, new.counters):
            for name in _COUNTED:  # the epoch's totals go on from the old pool's
                setattr(after, name, getattr(before, name))
        self.counters[:] = new.counters
        if new.generation != old.generation:
            new.new_epoch(old.generation)
        for w, job in _in_task_order(held):
            new.submit(w, job)

    def _act_on(self, watch: policy.HandoffWatch | policy.InlineWatch) -> None:
        """A watch says the workers load faster elsewhere: move them into the consumer's thread, or back to threads."""
        if isinstance(watch, policy.HandoffWatch):
            self._watch_seen = watch
            self.move(Mode.INLINE)
        else:
            self._back_to_threads(watch)

    def _back_to_threads(self, watch: policy.InlineWatch) -> None:
        """The tasks grew dearer than their hand-offs: the workers go on as threads, for good.

        Each goes on from its handoff, as into processes; its jobs not run yet follow it in order.
        """
        with self._lock:
            inline = self._current
            self._watch = None
            if self._stopped or not isinstance(inline, InlinePool):
                return
            handoffs = inline.handoffs()
            if handoffs is None:
                return  # a worker died: the others go on where they are
            cfg = dataclasses.replace(self._cfg, handoffs=handoffs, worker_states=None)
            try:
                threads = ThreadPool(cfg, list(range(self._cfg.num_workers)), caller=inline.caller)
            except Exception:  # noqa: BLE001 - the consumer's thread goes on: nothing is lost
                return
            held, messages = inline.take_back()
            for message in messages:  # before any of theirs
                threads.results.put(message)
            self._threads = threads
            self._go_on_in(threads, inline, held)
            self._report.mode, self._report.settled = Mode.THREADS, True
            self._report.reason = (
                f"adaptive: back on threads {time.monotonic() - self._started:.1f} s after the workers started: "
                f"in the consumer's thread a result took {watch.inline_s * 1e6:.1f} µs, "
                f"with threads {watch.threads_s * 1e6:.1f} µs")

    def _moved_reason(self) -> str:
        n = self._cfg.num_workers
        after = f"{time.monotonic() - self._started:.1f} s after the workers started"
        if self._target is Mode.INLINE:
            text = f"adaptive: the {n} workers moved into the consumer's thread {after}"
            watch = self._watch_seen
            if watch is None:
                return f"{text}: asked for ({policy.INLINE_AFTER_ENV})"
            return (f"{text}: a task took {watch.task_s * 1e6:.1f} µs, the consumer {watch.wait_s * 1e6:.1f} µs "
                    "per result: the hand-offs between threads cost more than the tasks")
        text = f"adaptive: moved into {n} worker processes {after}"
        v = self._verdict
        if v is None:
            return f"{text}: asked for ({policy.MOVE_AFTER_ENV})"
        return (f"{text}: the {n} worker threads took turns on the GIL ({v.cores:.2f} CPU cores used, "
                f"{v.task_cpu_s * 1e3:.1f} ms of CPU per task)")

    def _abort_move(self, why: str) -> None:
        with self._lock:
            self._abort_move_locked(why)

    def _abort_move_locked(self, why: str) -> None:
        """The workers stay threads for good: they get the held jobs, in order, behind their park."""
        held, self._held, self._parked = self._held, None, {}
        self._went_on = set()
        self._give_up(why)
        if held is None or self._stopped:
            return
        for w, jobs in held.items():
            for job in jobs:
                self._threads.submit(w, job)

    def _give_up(self, why: str) -> None:
        self._gave_up = True
        self._report.mode, self._report.reason, self._report.settled = Mode.THREADS, f"adaptive: stays on threads, {why}", True
