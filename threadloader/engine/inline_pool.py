"""The workers run in the consumer's thread: :class:`InlinePool`.

When a task costs less than handing it to a thread and its result back, the
hand-offs are the loader's whole cost. This pool does without them: each
worker keeps its identity (its copies of the dataset, its worker info and
generators) in a ``contextvars.Context`` of its own, and the consumer runs
the worker's next task in that context when it asks for a result. Tasks run
in the order they were submitted, so each worker serves its tasks in
DataLoader's order and draws from its own random streams as it would in a
thread. Each task runs as in a new thread: in the grad mode of the thread
that started the workers, without autocast or torch function modes.

The consumer cannot wait on a task it runs itself: a loader with a
``timeout`` never runs its workers here (:mod:`threadloader.adaptive.policy`).
"""

from __future__ import annotations

import collections
import contextvars
import os
import queue
import threading
from typing import Any, NamedTuple

import torch

from .._platform import torch_compat as _torch_compat
from ..stats.counters import WorkerCounters
from ..worker import handoff as _handoff
from ..worker import inherit
from ..worker.copies import WorkerParts, retire
from ..worker.handoff import WorkerHandoff
from . import hooks
from .protocol import STOPPED_MESSAGE, SYNC_TASK, Job, Kind, Message, WorkerConfig
from .thread_pool import parts_for
from .worker_loop import _map_step, _SetupError, _Shared, become_worker

__all__ = ["InlinePool", "InlineWorkerView"]

class _Unit(NamedTuple):
    """One worker run in the consumer's thread."""

    context: contextvars.Context
    cfg: WorkerConfig
    setup: _SetupError
    parts: WorkerParts
    release: hooks.Release


class _Messages(collections.deque):
    """The posted messages, in order: the worker loop posts with ``put``."""

    put = collections.deque.append


class _Jobs(_Shared):
    """The workers' jobs, as the worker loop reads them: one step takes the next, never waiting."""

    def __init__(self, worker_ids: list[int], results: Any, counters: Any) -> None:
        super().__init__(worker_ids, results, counters)
        self.jobs = {w: collections.deque() for w in worker_ids}  # type: ignore[misc]

    def next_job(self, worker_id: int) -> Job | None:
        jobs = self.jobs[worker_id]
        return jobs.popleft() if jobs else None


class InlineWorkerView:
    """What DataLoader's iterator shows of a worker process (``_workers``), for a worker run in the consumer's thread."""

    def __init__(self, pool: InlinePool, worker_id: int) -> None:
        self._pool = pool
        self._worker_id = worker_id

    @property
    def name(self) -> str:
        return f"threadloader-worker-{self._worker_id}"

    @property
    def pid(self) -> int:
        return os.getpid()

    @property
    def daemon(self) -> bool:
        return True

    @property
    def exitcode(self) -> int | None:
        return None if self.is_alive() else 0

    def is_alive(self) -> bool:
        return self._pool.serves(self._worker_id)

    def join(self, timeout: float | None = None) -> None:
        """Nothing to wait for: the worker only ever runs inside the consumer's calls."""

    def terminate(self) -> None:
        """Nothing to end: :meth:`InlinePool.stop` ends the workers."""

    def __repr__(self) -> str:
        return f"<InlineWorkerView {self.name} alive={self.is_alive()}>"


class InlinePool:
    """A :class:`~.protocol.Pool` whose workers run in the consumer's thread, each in a context of its own.

    Args:
        cfg: what every worker needs (a map-style dataset); ``cfg.handoffs``,
            where given, are the workers' states to go on from.
        caller: the state of the thread that started the workers, which
            they run in (:func:`threadloader.worker.inherit.capture`).
    """

    #: Its workers run in this process (:class:`~.protocol.Pool`).
    in_process = True

    def __init__(self, cfg: WorkerConfig, caller: inherit.CallerState) -> None:
        ids = list(range(cfg.num_workers))
        self.counters = [WorkerCounters() for _ in ids]
        self._messages = _Messages()
        self._shared = _Jobs(ids, self._messages, self.counters)
        #: Worker ids in the order their jobs were submitted: the order they run in.
        self._order: collections.deque[int] = collections.deque()
        self._dead: set[int] = set()
        self._lock = threading.Lock()  # stop() may come from a garbage collection in another thread
        #: The state of the thread that started the workers, which their tasks run in.
        self.caller = caller
        self._grad_enabled = caller.grad_enabled
        self._units: dict[int, _Unit] = {}
        self.replicas: dict[int, Any] = {}
        try:
            for w in ids:
                parts = parts_for(cfg, w)
                self.replicas[w] = parts.dataset
                context = inherit.new_context(caller)
                release = hooks.start_worker(cfg.items_per_task)
                try:
                    worker_cfg, setup = self._in(context, become_worker, cfg, w, parts)
                except BaseException:
                    release()
                    retire(parts)
                    raise
                self._units[w] = _Unit(context, worker_cfg, setup, parts, release)
        except BaseException:
            self.stop()
            raise

    # --- Pool ---------------------------------------------------------------------
    @property
    def results(self) -> InlinePool:
        """Where the consumer reads messages: :meth:`get`, which runs the tasks."""
        return self

    @property
    def generation(self) -> int:
        return self._shared.generation

    @property
    def workers(self) -> list[InlineWorkerView]:
        return [InlineWorkerView(self, w) for w in range(len(self.counters))]

    def serves(self, worker_id: int) -> bool:
        """Whether worker ``worker_id`` still takes tasks (not stopped, not dead)."""
        return not self._shared.stopping and worker_id not in self._dead

    def submit(self, worker_id: int, job: Job) -> None:
        """Queue ``job`` for worker ``worker_id``; it runs when the consumer asks for a result.

        Raises:
            RuntimeError: the pool was stopped.
        """
        with self._lock:
            if self._shared.stopping:
                raise RuntimeError(STOPPED_MESSAGE)
            if worker_id in self._dead:
                return  # as a dead thread's queue: never served
            self._shared.jobs[worker_id].append(job)
            self._order.append(worker_id)

    def new_epoch(self, generation: int | None = None, seed: int | None = None) -> None:
        """Start a new generation; jobs already queued still run first, in order (see ``ThreadPool.new_epoch``).

        Raises:
            RuntimeError: the pool was stopped.
        """
        if self._shared.stopping:
            raise RuntimeError(STOPPED_MESSAGE)
        self._shared.new_epoch(generation, seed)

    def get(self, block: bool = True, timeout: float | None = None) -> Message:
        """The next message: a result already posted, or that of the next queued task, run now.

        Raises:
            queue.Empty: no task is queued and nothing was posted.
            KeyboardInterrupt: raised in a task (the worker is reported dead too).
        """
        while True:
            if self._messages:
                return self._messages.popleft()
            with self._lock:
                worker_id = self._order.popleft() if self._order and not self._shared.stopping else None
            if worker_id is None:
                raise queue.Empty
            self._run_next(worker_id)

    def stop(self, keep_copies: bool = False) -> None:
        """End the workers (idempotent): unrun jobs and unread results are dropped.

        Args:
            keep_copies: leave the workers' copies as they are (handed over to
                go on elsewhere in this process); else they are retired.
        """
        with self._lock:
            self._shared.stopping = True
            self._order.clear()
            for jobs in self._shared.jobs.values():
                jobs.clear()
            units, self._units = self._units, {}
        self._messages.clear()
        for unit in units.values():  # their contexts go with them: nothing to leave
            unit.release()
            if not keep_copies:
                retire(unit.parts)

    # --- going on elsewhere -----------------------------------------------------------
    def handoffs(self) -> dict[int, WorkerHandoff] | None:
        """What each worker would take to go on in a thread, as it stands between two tasks; None: a worker died."""
        with self._lock:
            if self._dead or self._shared.stopping:
                return None
            units = dict(self._units)
        return {w: unit.context.run(_handoff.capture, unit.parts, unit.setup.error, unit.setup.gen)
                for w, unit in units.items()}

    def take_back(self) -> tuple[dict[int, list[Job]], list[Message]]:
        """The jobs not run yet, by worker and in order, and the results not read yet, in order; then stop.

        The workers' copies are kept: they go on with them elsewhere (:meth:`handoffs`).
        """
        with self._lock:
            held = {w: list(jobs) for w, jobs in self._shared.jobs.items()}
            messages = list(self._messages)
        self.stop(keep_copies=True)
        return held, messages

    # --- running a task -----------------------------------------------------------
    def _run_next(self, worker_id: int) -> None:
        """Run worker ``worker_id``'s next job in its context; a BaseException ends the worker, as it ends a thread."""
        unit = self._units.get(worker_id)
        jobs = self._shared.jobs[worker_id]
        if unit is None or not jobs:
            return
        shared = self._shared
        if jobs[0].task == SYNC_TASK:  # every job queued before it has run
            job = jobs.popleft()
            shared.results.put(Message(Kind.SYNCED, job.generation, SYNC_TASK, worker_id, None))
            return
        try:
            self._in(unit.context, _map_step, shared, unit.cfg, worker_id, unit.setup, unit.parts)
        except BaseException as exc:
            with self._lock:
                self._dead.add(worker_id)
                jobs.clear()
            shared.results.put(Message(Kind.DIED, shared.generation, -1, worker_id, exc))
            if isinstance(exc, KeyboardInterrupt):
                raise  # most likely the user's Ctrl-C, which lands in this thread
        finally:
            shared.counters[worker_id].busy = False

    def _in(self, context: contextvars.Context, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` in ``context``, with this thread's torch state as a new worker thread's."""
        if (torch.is_grad_enabled() is self._grad_enabled and _torch_compat.function_mode_depth() == 0
                and not torch.is_inference_mode_enabled() and not _torch_compat.autocast_devices()):
            return context.run(fn, *args)
        modes = []
        while _torch_compat.function_mode_depth():
            modes.append(_torch_compat.pop_function_mode())
        autocast = _torch_compat.autocast_devices()
        try:
            for device in autocast:
                torch.set_autocast_enabled(device, False)
            with torch.inference_mode(False), torch.set_grad_enabled(self._grad_enabled):
                return context.run(fn, *args)
        finally:
            for device in autocast:
                torch.set_autocast_enabled(device, True)
            for mode in reversed(modes):
                _torch_compat.push_function_mode(mode)
