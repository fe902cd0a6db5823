"""A child's only worker, run in the child's main thread: no dispatcher thread between its job queue and it.

A ``worker_processes`` child holding several workers reads its job queue in
its main thread and hands each job to that worker's thread
(:class:`threadloader.engine.thread_pool.ThreadPool`). A child holding one
worker (one worker per process, as DataLoader's) runs the same worker loop
(:func:`threadloader.engine.worker_loop._worker_main`) in its main thread
instead: the loop's wait for its next job reads the job queue itself
(:class:`InlineShared`), so a task reaches it without a hand-off between
threads. What the dispatcher did between jobs (the arena's released blocks, a
new epoch, the parent's watch) happens in that wait, through the same
:class:`Dispatcher`.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Protocol

import torch

from .._platform import torch_compat as _torch_compat
from ..engine.protocol import Job, WorkerConfig
from ..engine.thread_pool import parts_for
from ..engine.worker_loop import _Shared, _worker_main
from ..stats.cpu import process_cpu_seconds
from ..worker import inherit
from ..worker.copies import retire
from .counters import CPU
from .pipe_queue import PipeQueue
from .readers import Readers
from .wire import NEW_EPOCH, RELEASED, job_of

#: How often a child samples its CPU time for the parent's stats while jobs keep coming (seconds).
_SAMPLE_S = 0.01

__all__ = ["Dispatcher", "EpochTarget", "InlineShared", "run_inline"]


class EpochTarget(Protocol):
    """What takes a new epoch from the job queue: the child's ``ThreadPool``, or :class:`InlineShared`."""

    def new_epoch(self, generation: int | None = None, seed: int | None = None) -> None: ...


class Dispatcher:
    """A child's job queue as its main thread reads it: control messages handled, jobs returned.

    Args:
        jobs: the child's job queue (``(worker_id, job)``, :data:`.wire.NEW_EPOCH`,
            :data:`.wire.RELEASED`, or None: stop).
        arena: the child's :class:`~.arena.ChildArena` (blocks the parent let go of).
        array: the loader's counters (this process's CPU time goes to ``row``'s CPU column).
        row: the row of the child's first worker.
        loader_alive: whether the loader's process still lives.
        poll_s: how often the loader is watched while no job comes.
    """

    def __init__(self, jobs: PipeQueue, arena: Any, array: Any, row: int, loader_alive: Callable[[], bool],
                 poll_s: float) -> None:
        self._jobs = jobs
        self._arena = arena
        self._array = array
        self._row = row
        self._loader_alive = loader_alive
        self._poll_s = poll_s
        # One poll per wait (a queue's get with a timeout builds a selector each time).
        self._readers = Readers([jobs.reader])
        self._sampled = -float("inf")

    def next(self, target: EpochTarget) -> tuple[int, Job] | None:
        """The next ``(worker_id, job)``; None: told to stop, or the loader's process is gone.

        Args:
            target: what a new epoch read meanwhile is handed to.
        """
        while True:
            now = time.monotonic()
            if now - self._sampled >= _SAMPLE_S:
                # This process's CPU time, for the parent's GIL check (stats):
                # fresh to within _SAMPLE_S or a job, against its windows of seconds.
                self._sampled = now
                self._array[self._row, CPU] = process_cpu_seconds()
            if not self._readers.wait(self._poll_s):
                if not self._loader_alive():
                    return None  # orphaned (the loader's process was killed)
                continue
            # This thread alone reads the queue: a whole message is there, or
            # coming (an end of file, if the loader's process died writing it, raises).
            msg = self._jobs.get()
            if msg is None:
                return None
            worker_id, job = msg
            if worker_id == RELEASED:
                self._arena.parent_released(*job)
            elif worker_id == NEW_EPOCH:
                target.new_epoch(*job)
            else:
                return worker_id, job_of(job)

    def close(self) -> None:
        """Let go of the counters array and the arena (the child is ending); :meth:`next` may not be called again."""
        self._array = None
        self._arena = None


class InlineShared(_Shared):
    """The worker loop's shared state for a worker run in the child's main thread: its next job comes from the
    :class:`Dispatcher`.

    Args:
        worker_id: the child's only worker.
        results: the child's result queue (a :class:`~.wire.ParcelQueue`).
        counters: that worker's counters, by worker id.
        dispatcher: the child's job queue.
    """

    def __init__(self, worker_id: int, results: Any, counters: Any, dispatcher: Dispatcher) -> None:
        super().__init__([worker_id], results, counters)
        self.jobs = {}  # its jobs come from the dispatcher
        self._dispatcher = dispatcher
        #: Reading the job queue ended (told to stop, orphaned, or it raised: ``error``).
        self.ended = False
        #: What reading the job queue raised: raised again outside the worker loop, as the dispatcher's would be.
        self.error: BaseException | None = None

    def next_job(self, worker_id: int) -> Job | None:
        """The worker's next job, control messages handled on the way (None: stop)."""
        try:
            got = None if self.ended else self._dispatcher.next(self)
        except BaseException as exc:  # noqa: BLE001 - not the worker's failure: the child's, raised by run_inline
            self.error = exc
            got = None
        if got is None:
            self.ended = True
            return None
        return got[1]


def _leave_what_threads_do_not_inherit() -> None:
    """Drop what this thread holds of the thread that forked the child and a new worker thread would not.

    A forked child's main thread is a copy of the loader's thread: its torch
    function modes and autocast too, which worker threads do not inherit
    (docs/differences.md). The child's main thread runs nothing else after.
    """
    while _torch_compat.top_function_mode() is not None:
        _torch_compat.pop_function_mode()
    for device in _torch_compat.autocast_devices():
        torch.set_autocast_enabled(device, False)


def run_inline(cfg: WorkerConfig, worker_id: int, shared: InlineShared) -> None:
    """Run worker ``worker_id`` in this thread until the child is told to stop or orphaned.

    A worker loop that ends before that (its worker died, and said so) leaves
    the child reading its job queue, as a dead worker thread leaves the
    dispatcher: its jobs are dropped, control messages still handled.

    Raises:
        BaseException: what reading the job queue raised (the child's failure,
            not its worker's), or SystemExit from SIGTERM.
    """
    # What the worker's thread would be called: collate functions and
    # __reduce__ methods see the same name as in a child of several workers.
    threading.current_thread().name = f"threadloader-worker-{worker_id}"
    caller = inherit.capture()
    _leave_what_threads_do_not_inherit()
    parts = parts_for(cfg, worker_id)  # new copies, or those of a worker handed over
    try:
        # As a worker thread starts (ThreadPool): the caller's state set up
        # by inherit, inference mode carried as grad mode off.
        with torch.inference_mode(False):
            inherit.run_inheriting(caller, _worker_main, shared, cfg, worker_id, parts)
        if shared.error is not None:
            raise shared.error
        # The worker loop ends for good where it swallowed SIGTERM's SystemExit (``stopping``).
        while not shared.ended and not shared.stopping and shared._dispatcher.next(shared) is not None:
            pass  # its worker is gone: the parent reports it, and sends it no more tasks
    finally:
        shared.stopping = True
        shared.error = None  # no cycle through its traceback
        retire(parts)
