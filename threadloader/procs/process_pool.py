"""The parent's side of the process layer: :class:`ProcessPool`.

With ``worker_processes=P`` the ``num_workers`` workers run as threads of P
child processes started through ``torch.multiprocessing`` (the loader's
``multiprocessing_context`` when given, else torch's default start method).
Worker ``w`` lives in process ``w % P``: tasks go to workers round robin (as in
DataLoader), so consecutive tasks go to different processes. What a child runs
is in :mod:`.child`; ``default_collate`` and ``frame_collate`` build batches
there in the child's arena of shared-memory blocks (:mod:`.arena`), which this
process maps once per block (each child's :class:`~.mirror.Mirror`): a batch
travels as its block's id, and the ids of the blocks the consumer let go of go
back with the child's next job (:mod:`.wire`).

In the parent, when the loader pins, one receiver thread per child reads that
child's result queue, pins the batch (off the consumer thread), and forwards it
to the one result queue the consumer reads (:class:`_Inbox`, whose ``get``
unpickles a payload the receiver did not: see :class:`~.wire.Parcel`), so the
consumer cannot tell threads from processes. A receiver also notices its child
dying and tells the consumer, which raises DataLoader's "exited unexpectedly"
error instead of hanging. When nothing is pinned the consumer's ``get`` does
the receivers' work itself (:class:`_DirectInbox`), as DataLoader's consumer
reads its workers' queue: no thread hand-off per batch.

Children never outlive the parent: they are daemonic (multiprocessing
terminates them at exit), they stop when told, the parent terminates any that
do not stop in time, and each child watches the loader's process (:mod:`.child`).
"""

from __future__ import annotations

import dataclasses
import numbers
import operator
import os
import pickle
import queue
import signal
import threading
import time
import warnings
import weakref
from multiprocessing import connection as mp_connection
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as torch_mp

from .._platform import fork as _fork
from .._platform import torch_compat as _torch_compat
from .._platform.torch_compat import ExceptionWrapper
from ..engine.protocol import STOPPED_MESSAGE, Job, Kind, Message, PoolFactory, ProcessDeath, Stated, WorkerConfig
from ..engine.thread_pool import JOIN_BUDGET_S
from ..engine.worker_loop import pin_task
from .child import POLL_S, child_main
from .counters import COLUMNS, CPU, ArrayCounters
from .mirror import Mirror
from .pipe_queue import PipeQueue
from .readers import Readers
from .wire import NEW_EPOCH, RELEASED, Parcel, ReceiveError, job_message, received

__all__ = ["ProcessPool", "check_worker_processes", "process_pool_factory"]

#: When nothing is pinned, the consumer reads the children's result pipes itself
#: (:class:`_DirectInbox`); False: receiver threads read them, as when pinning.
DIRECT_READ = True

#: How long a dead child's exit code may take to appear when another thread reaps it.
EXIT_CODE_WAIT_S = 1.0

#: How long a forked child may take to reach its own code (child_main) before
#: it counts as hung in the fork, and how many forks a child gets. CPython
#: before 3.11.10 (gh-112275) can leave a forked child waiting for ever in its
#: after-fork clean-up; the race is rare, so a new fork almost always starts.
#: A child counted as hung wrongly has run none of the loader's code: starting
#: another costs only the wait.
FORK_START_S = 10.0
FORK_ATTEMPTS = 3

#: Warned when a forked child hung before running any code and was started again.
FORK_HANG_WARNING = (
    "ThreadDataLoader: a worker process forked for worker_processes did not start within {seconds:g} s "
    "(its fork hung in CPython's after-fork clean-up: CPython gh-112275, fixed in 3.11.10 and 3.12, or an "
    "at-fork handler waiting on a lock); it was killed and forked again. "
    "multiprocessing_context='forkserver' or 'spawn' does not fork this process."
)

#: DataLoader's warning when starting a worker process fails to pickle its
#: arguments (torch.utils.data.dataloader), word for word.
PICKLE_WARNING = (
    "Got pickle error when attempting to start a worker Process. "
    "This might be because the worker Process arguments are not picklable. "
    "Python 3.14+ changed the multiprocessing start method in non-Mac POSIX platforms "
    "to 'forkserver', which requires the worker Process arguments to be picklable. "
    "You can also try multiprocessing.set_start_method('fork')."
)


def check_worker_processes(worker_processes: Any, num_workers: int) -> None:
    """Validate ``worker_processes`` against ``num_workers`` (None: the adaptive mode, always valid).

    Raises:
        ValueError: not an integer (any ``numbers.Integral`` but bool, as
            DataLoader takes NumPy ints for ``num_workers``), negative, more
            processes than workers, or processes without workers.
    """
    if worker_processes is None:  # the loader decides
        return
    if isinstance(worker_processes, bool) or not isinstance(worker_processes, numbers.Integral):
        raise ValueError(
            f"worker_processes option should be an int, but got worker_processes={worker_processes!r}"
        )
    if worker_processes < 0:
        raise ValueError(
            "worker_processes option should be non-negative; use worker_processes=0 to run all workers as "
            "threads of this process."
        )
    if worker_processes > 0 and num_workers == 0:
        raise ValueError(
            "worker_processes option could only be specified with worker threads. let num_workers > 0 to "
            "enable them, otherwise set worker_processes to 0."
        )
    if 0 < worker_processes and 0 <= num_workers < worker_processes:  # num_workers < 0: the iterator's AssertionError
        raise ValueError(
            f"worker_processes option should be at most num_workers (each process runs at least one worker "
            f"thread), but got worker_processes={worker_processes} and num_workers={num_workers}."
        )


def process_pool_factory(num_processes: int, mp_context: Any = None, prefetch_factor: int = 2) -> PoolFactory:
    """The engine's pool factory for ``worker_processes``: see :class:`ProcessPool` for the arguments."""

    def make(cfg: WorkerConfig) -> ProcessPool:
        return ProcessPool(cfg, num_processes, mp_context, prefetch_factor)

    return make


#: Held while a pool makes and starts one child (see ProcessPool.__init__).
_start_lock = threading.Lock()
_fork.renew_after_fork(__name__, "_start_lock")


class _Child:
    """One worker process and the parent's ends of its queues."""

    def __init__(self, ctx: Any, index: int, worker_ids: list[int]) -> None:
        self.index = index
        self.worker_ids = worker_ids
        self.jobs = PipeQueue(ctx)
        self.results = PipeQueue(ctx)
        # Its write end is for its child alone (see close_writing_end).
        _fork.private_fd(self.results.writer.fileno(), self)
        self.process: Any = None
        self.receiver: threading.Thread | None = None
        # Its batch buffers as mapped here (closed by the pool's stop()).
        self.mirror = Mirror()

    def discard(self) -> None:
        """Kill this child, which has run none of the loader's code, and close this process's ends of its queues."""
        self.process.kill()
        self.process.join()
        self.mirror.close()
        self.close_queues()

    def close_queues(self) -> None:
        """Close this process's ends of the child's job and result queues (idempotent)."""
        self.close_writing_end()  # a child that failed to start still had it
        for q in (self.jobs, self.results):
            q.close()

    def close_writing_end(self) -> None:
        """Close this process's copy of the write end of the child's result queue (the child has its own; idempotent).

        Then a child that dies in the middle of writing a result leaves its
        receiver an end of file, not a read that waits for ever for the rest of
        the message. Closed right after the child started, so children started
        later do not inherit it; a process forked before that, by another
        thread, gets ``/dev/null`` in its place (:mod:`threadloader._platform.fork`).
        """
        writer = self.results.writer
        if not writer.closed:
            _fork.release_private_fd(writer.fileno())
            writer.close()


class _Inbox:
    """The pool's result queue, read by the consumer: ``get`` opens each :class:`~.wire.Parcel` payload there.

    Args:
        by_worker: each worker id's :class:`_Child` (the pool's own dict,
            filled as its children start; not the pool: no reference cycle).
    """

    def __init__(self, by_worker: dict[int, "_Child"]) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._by_worker = by_worker
        self.put = self._queue.put

    def discard_all(self) -> None:
        """Drop every message queued, each payload unpickled first (see :meth:`~.wire.Parcel.discard`)."""
        while True:
            try:
                payload = self._queue.get_nowait().payload
            except queue.Empty:
                return
            if type(payload) is Parcel:
                payload.discard()

    def get(self, block: bool = True, timeout: float | None = None) -> Message:
        """The next message, its payload opened (``queue.SimpleQueue.get``'s arguments and ``queue.Empty``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            opened = self._opened(self._queue.get(block, remaining))
            if opened is not None:
                return opened

    def _opened(self, message: Message) -> Message | None:
        """``message`` with its payload opened; None: dropped, as its worker's death is reported next."""
        if type(message.payload) is not Parcel:
            return message
        opened = message.payload.open()
        # As the receiver's check (_forward): a receive error from a worker
        # that died is its death, which its receiver reports next.
        dropped = isinstance(opened, ReceiveError) and _exited(self._by_worker[message.worker_id])
        try:
            return None if dropped else message._replace(payload=opened)
        finally:
            # A receive error's traceback reaches this frame (f_back):
            # holding it here would make a cycle, kept until a collection.
            del opened

    def drain(self, child: "_Child") -> None:
        """Discard what ``child`` left in its result pipe (the pool stops; its receiver did that here)."""


class _DirectInbox(_Inbox):
    """The inbox when nothing is pinned: the consumer's ``get`` reads the children's result pipes itself.

    No receiver thread stands between a child and the training loop, so a
    batch reaches it without a hand-off between threads (as DataLoader's
    consumer reads its workers' queue itself). Everything a receiver did
    happens in ``get`` instead, with the receiver's own code
    (:func:`_receive_one`): results go to the queue of :class:`_Inbox`, which
    ``get`` then serves, deaths and a broken channel are noticed there, and
    each child is polled for its death at least every ``POLL_S``.

    Args:
        by_worker: as for :class:`_Inbox`.
        children: the pool's list of children (filled as they start).
        pool: a weak reference to the pool (no reference cycle).
    """

    def __init__(self, by_worker: dict[int, "_Child"], children: list["_Child"], pool: Any) -> None:
        super().__init__(by_worker)
        self._children = children
        self._pool = pool
        #: Children whose pipe is read no more: dead, or their channel broke (reported).
        self._done: set[int] = set()
        self._checked = time.monotonic()
        #: The result pipes of the children not done, once they started (filled by get).
        self._readers = Readers()
        self._watched: set[int] = set()

    def get(self, block: bool = True, timeout: float | None = None) -> Message:
        """The next message, its payload opened (``queue.SimpleQueue.get``'s arguments and ``queue.Empty``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            pool = self._pool()
            live = [] if pool is None or pool.stopping else [c for c in self._children if c.index not in self._done]
            if not live:  # nothing is read any more (stopping, or every child reported gone): what is queued
                del pool
                return super().get(block, None if deadline is None else max(0.0, deadline - time.monotonic()))
            try:
                message = self._queue.get_nowait()
            except queue.Empty:
                self._read(pool, live, deadline if block else time.monotonic())
            else:
                opened = self._opened(message)
                if opened is not None:
                    return opened
                continue
            del pool
            if self._queue.empty() and (not block or (deadline is not None and time.monotonic() >= deadline)):
                raise queue.Empty

    def _read(self, pool: "ProcessPool", live: list["_Child"], deadline: float | None) -> None:
        """Wait, until ``deadline`` and at most ``POLL_S``, for results; queue one from each child that sent some."""
        for child in live:
            if child.index not in self._watched:
                self._watched.add(child.index)
                self._readers.add(child.results.reader)
        wait_s = POLL_S if deadline is None else min(POLL_S, max(0.0, deadline - time.monotonic()))
        try:
            ready = self._readers.wait(wait_s)
        except (OSError, ValueError):  # a pipe closed by stop() in another thread: get sees it stopping
            return
        for child in live:
            # This thread alone reads its pipe: a whole message is there, or an end of file.
            if child.results.reader in ready and not _receive_one(pool, child, child.process.pid, None):
                self._retire(child)
        now = time.monotonic()
        if ready and now - self._checked < POLL_S:
            return
        # As an idle receiver does every POLL_S: a child that died is reported
        # once its pipe is empty (a grandchild may hold that pipe open).
        self._checked = now
        for child in live:
            if child.index not in self._done and not _receive_one(pool, child, child.process.pid, 0.0):
                self._retire(child)

    def _retire(self, child: "_Child") -> None:
        """Read ``child``'s pipe no more (its death or broken channel was reported)."""
        self._done.add(child.index)
        self._readers.remove(child.results.reader)

    def drain(self, child: "_Child") -> None:
        """Discard what ``child`` left in its result pipe, never waiting for the rest of a cut message."""
        reader = child.results.reader
        try:
            os.set_blocking(reader.fileno(), False)
            while True:
                payload = received(child.results.get(block=False)).payload
                if type(payload) is Parcel:
                    payload.discard()
        except Exception:  # noqa: BLE001 - empty, a cut message, a closed pipe: nothing more to read
            pass


class ProcessPool:
    """The engine's :class:`~threadloader.engine.protocol.Pool`, over child processes.

    Args:
        cfg: what every worker needs (pinning, if asked, happens in the parent).
        num_processes: P, 1 .. ``cfg.num_workers``.
        mp_context: the loader's ``multiprocessing_context`` (None: torch's default).
        prefetch_factor: tasks in flight per worker (sizes each child's
            arena of batch buffers, :mod:`.arena`).
    """

    #: Its workers run in child processes, which hold their dataset copies.
    in_process = False
    replicas = None

    def __init__(self, cfg: WorkerConfig, num_processes: int, mp_context: Any = None, prefetch_factor: int = 2) -> None:
        num_processes = operator.index(num_processes)  # a NumPy int too
        self._ctx = mp_context if mp_context is not None else torch_mp
        self._pin = cfg.pin
        self._pin_device = cfg.pin_device
        self._device_index = cfg.device_index
        self._by_worker: dict[int, _Child] = {}
        self.results = _Inbox(self._by_worker)
        self.generation = 0
        self.stopping = False
        self._stopped = False
        self._owner_pid = os.getpid()
        #: Why the pool failed (the consumer's RuntimeError message), once it has.
        self.failure: str | None = None
        self._failure_lock = threading.Lock()
        num_workers = cfg.num_workers
        workers = range(num_workers)  # first: a float gives DataLoader's TypeError, as with threads
        self._counter_tensor = torch.zeros((len(workers), COLUMNS), dtype=torch.float64).share_memory_()
        array = self._counter_tensor.numpy()
        array[:, CPU] = np.nan  # not sampled yet: no GIL verdict on a window starting before the child runs
        self.counters = [ArrayCounters(array, w, w % num_processes) for w in workers]
        child_cfg = dataclasses.replace(cfg, pin=False, device_index=None)
        # A parent-death signal fires when the *thread* that forked exits: only
        # ask for it when that thread is the main thread (its end is the process's).
        death_signal = threading.current_thread() is threading.main_thread()
        self._children: list[_Child] = []
        if DIRECT_READ and not cfg.pin:  # nothing to pin: the consumer reads the children's pipes itself
            self.results = _DirectInbox(self._by_worker, self._children, weakref.ref(self))

        def start_child(p: int) -> _Child:
            # One child at a time across pools: another pool's fork must not
            # fall between this pipe's creation and its registration.
            with _start_lock:
                child = _Child(self._ctx, p, list(range(p, num_workers, num_processes)))
                if p < len(self._children):
                    self._children[p] = child
                else:
                    self._children.append(child)
                # Its batches in circulation: in flight, the one the
                # consumer holds, the one being pinned (sizes its arena).
                arena_batches = prefetch_factor * len(child.worker_ids) + 2
                child.process = self._ctx.Process(
                    target=child_main,
                    args=(_own_handoffs(child_cfg, child.worker_ids), child.worker_ids, child.jobs, child.results, self._counter_tensor,
                          os.getpid(), death_signal, child.mirror.token, arena_batches),
                    name=f"threadloader-process-{p}",
                    daemon=True,
                )
                with _fork.forking_for(child):  # its child (fork) keeps its result pipe's write end
                    _start(child.process)
                child.close_writing_end()
                return child

        try:
            for p in range(num_processes):
                start_child(p)
            # A context, or torch.multiprocessing (the default context's method, set by the starts above).
            if self._ctx.get_start_method() == "fork":
                self._fork_again_where_hung(array, start_child)
            for child in self._children if type(self.results) is not _DirectInbox else ():
                child.receiver = threading.Thread(
                    target=_receive, args=(self, child), name=f"threadloader-receiver-{child.index}", daemon=True
                )
                child.receiver.start()
        except BaseException:
            self.stop()
            raise
        self._by_worker.update((w, c) for c in self._children for w in c.worker_ids)

    def _fork_again_where_hung(self, array: np.ndarray, start_child: Any) -> None:
        """Kill and fork again each child that has not reached its own code within :data:`FORK_START_S`.

        A child's first act is to write its CPU time into ``array`` (NaN until
        then). No job was sent to any child yet, so a new one replaces a hung
        one unnoticed.

        Raises:
            RuntimeError: a child still hung after :data:`FORK_ATTEMPTS` forks.
        """
        for attempt in range(1, FORK_ATTEMPTS + 1):
            deadline = time.monotonic() + FORK_START_S
            waiting = list(self._children)
            while waiting and time.monotonic() < deadline:
                # Started, or already gone (its receiver reports a death).
                waiting = [c for c in waiting if np.isnan(array[c.worker_ids[0], CPU]) and c.process.exitcode is None]
                if waiting:
                    time.sleep(0.002)
            if not waiting:
                return
            for child in waiting:
                child.discard()
                array[child.worker_ids[0], CPU] = np.nan  # in case it wrote just before it was killed
            if attempt == FORK_ATTEMPTS:
                raise RuntimeError(
                    f"DataLoader worker process {waiting[0].index} did not start: {FORK_ATTEMPTS} forks of this "
                    f"process hung for {FORK_START_S:g} s each before running any code (CPython's after-fork "
                    "clean-up: CPython gh-112275 before 3.11.10, or an at-fork handler waiting on a lock). "
                    "Use multiprocessing_context='forkserver' or 'spawn'."
                )
            for child in waiting:
                warnings.warn(FORK_HANG_WARNING.format(seconds=FORK_START_S), RuntimeWarning, stacklevel=2)
                start_child(child.index)

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids."""
        return [c.process.pid for c in self._children if c.process is not None]

    def submit(self, worker_id: int, job: Job) -> None:
        """Queue ``job`` for worker ``worker_id`` (in its process).

        Raises:
            RuntimeError: the pool was stopped (the failure's message when a
                worker process died), never an error of a closed queue.
        """
        if self._stopped:
            raise RuntimeError(self.failure or STOPPED_MESSAGE)
        child = self._by_worker[worker_id]
        released = child.mirror.take_released()
        if released is not None:  # the batch buffers the consumer let go of: the child may reuse them
            child.jobs.put((RELEASED, released))
        child.jobs.put(job_message(worker_id, job))

    def new_epoch(self, generation: int | None = None, seed: int | None = None) -> None:
        """Start a new generation: results of older ones are stale from now on.

        Each child's threads still run the jobs queued before it, in order
        (see ``ThreadPool.new_epoch``, which also says what ``seed`` is); the
        consumer drops their results.

        Raises:
            RuntimeError: a worker process died (DataLoader's "exited
                unexpectedly" message, as raised for the death, again: as
                DataLoader's next epoch does), or the pool was stopped.
        """
        if self.failure is not None or self._stopped:
            self.stop()  # a failed pool serves no epoch: stop what still runs
            raise RuntimeError(self.failure or STOPPED_MESSAGE)
        self.generation = self.generation + 1 if generation is None else generation
        for child in self._children:
            child.jobs.put((NEW_EPOCH, (self.generation, seed)))

    @property
    def workers(self) -> list[Any]:
        """The process each worker runs in, in worker order (DataLoader's ``_workers`` shape).

        They keep answering ``is_alive()``, ``pid``, ``exitcode`` and
        ``join()`` after the pool stops, as DataLoader's do: they are never closed.
        """
        return [self._by_worker[w].process for w in sorted(self._by_worker)]

    def child_died(self, child: "_Child", detail: str) -> None:
        """Tell the consumer that ``child`` died: its workers are gone, as dead DataLoader worker processes.

        The consumer raises DataLoader's "exited unexpectedly" error, caused by
        ``detail``, once, where the first task they left undone was due, and
        goes on with the other processes' workers.
        """
        death = ProcessDeath(child.process.pid, tuple(child.worker_ids), detail)
        self.results.put(Message(Kind.DIED, self.generation, -1, child.worker_ids[0], death))

    def fail(self, message: str) -> None:
        """Record the pool's failure and tell the consumer (its first failure wins, in both)."""
        with self._failure_lock:
            if self.failure is None:
                self.failure = message
            self.results.put(Message(Kind.CRASHED, -1, -1, -1, message))

    def stop(self) -> None:
        """Stop the children and the receivers; terminate what does not stop in time (idempotent)."""
        if self._stopped:
            return
        self._stopped = self.stopping = True
        if os.getpid() != self._owner_pid:
            # A forked copy of the owner (collected as garbage in a forked child,
            # or at its exit): the children, queues and receivers are the
            # owner's. Stopping them from here would end the owner's epoch.
            return
        started = [c for c in self._children if c.process is not None and c.process.pid is not None]
        current = threading.current_thread()
        for child in started:
            try:
                child.jobs.put(None)
            except (OSError, ValueError):  # pragma: no cover - queue already closed
                pass
            if child.jobs.writer_thread is current:
                # Stopped by a garbage collection on the thread that writes this
                # child's backlog of jobs: the None above leaves only once this
                # returns. SIGTERM tells the child now (it unwinds and exits).
                child.process.terminate()
        # A child stops its threads within JOIN_BUDGET_S, then exits.
        deadline = time.monotonic() + JOIN_BUDGET_S + 1.0
        for child in started:
            child.process.join(timeout=max(0.0, deadline - time.monotonic()))
        for child in started:
            if child.process.is_alive():
                child.process.terminate()  # SIGTERM: the child unwinds and exits
                child.process.join(timeout=0.5)
            if child.process.is_alive():  # pragma: no cover - stuck in C code ignoring SIGTERM
                child.process.kill()
                # Bounded: a child in uninterruptible sleep (a dead NFS mount)
                # dies only when that ends; DataLoader does not wait for it either.
                child.process.join(timeout=5.0)
        receivers_deadline = time.monotonic() + JOIN_BUDGET_S + POLL_S  # one wait for them all
        for child in self._children:
            # Whatever its receiver does: a result it still unpickles now fails
            # (the pool is stopping: nobody reads it), and nothing stays mapped.
            child.mirror.close()
            if child.receiver is current:  # stopped from its own receiver (GC there): it exits next
                continue
            if child.receiver is None and child.process is not None:
                self.results.drain(child)  # what no receiver read (the consumer reads the pipes itself)
            elif child.receiver is not None:
                # It stops within POLL_S of its last result. One still blocked
                # (a result pipe's write end held by a process forked outside
                # threadloader: see _fork) is left, a daemon, with its queue open:
                # closing a pipe another thread reads could hand it a reused number.
                child.receiver.join(timeout=max(0.0, receivers_deadline - time.monotonic()))
                if child.receiver.is_alive():
                    continue
            child.close_queues()
            # The Process objects stay open (DataLoader never closes its
            # workers either): ``_workers`` must keep answering. Their pipes
            # close when the pool is collected.
        self.results.discard_all()
        # The loader keeps its last stats, and with them these counters: give
        # them private memory, or each loader kept would hold the shared
        # array (an open file descriptor) for as long as it lives.
        for counters in self.counters:
            counters.detach()
        self._counter_tensor = None


def _own_handoffs(cfg: WorkerConfig, worker_ids: list[int]) -> WorkerConfig:
    """``cfg`` for the child running ``worker_ids``: with only their handoffs (each pickles with its child alone)."""
    if cfg.handoffs is None:
        return cfg
    return dataclasses.replace(cfg, handoffs={w: cfg.handoffs[w] for w in worker_ids})


def _start(process: Any) -> None:
    """Start one worker process, warning as DataLoader does when its arguments do not pickle."""
    try:
        process.start()
    except (TypeError, AttributeError, pickle.PicklingError):
        _torch_compat.warn_as_worker_start(PICKLE_WARNING)
        raise


def _receive(pool: ProcessPool, child: _Child) -> None:
    """Body of a receiver thread: forward one child's results to the consumer."""
    if pool._pin and pool._device_index is not None:
        torch.accelerator.set_device_index(pool._device_index)
    pid = child.process.pid
    while _receive_one(pool, child, pid):
        pass


def _receive_one(pool: ProcessPool, child: _Child, pid: int, timeout: float | None = POLL_S) -> bool:
    """Forward one result, waiting up to ``timeout`` for it (a function so that an idle receiver holds no batch).

    Args:
        timeout: None when the pipe is known to hold data (read without a wait).

    Returns:
        False: read this child no more (its death or a broken channel was reported, or the pool stops).
    """
    try:
        msg = received(child.results.get(timeout=timeout))
    except queue.Empty:
        if pool.stopping:
            return False
        if _exited(child, timeout=0.0):
            # Re-check: results it posted just before dying are delivered first.
            if not child.results.empty():
                return True
            if not pool.stopping:
                pool.child_died(child, _crash_message(pid, _exit_code(child)))
            return False
        return True
    except Exception as exc:  # noqa: BLE001 - the channel itself broke (payloads fail as their task: Parcel)
        # A broken pipe is most often a child that just died. A clean end of
        # file says nothing more than its death (only the child wrote there).
        detail = "" if isinstance(exc, EOFError) else f"Receiving its result failed: {exc!r}"
        if not pool.stopping and not _failed_if_died(pool, child, pid, detail):
            pool.fail(f"Receiving a result from DataLoader worker process (pid {pid}) failed: {exc!r}")
        return False
    if pool.stopping:  # nobody reads it
        forwarded = False
        if type(msg.payload) is Parcel:
            msg.payload.discard()
    else:
        forwarded = _forward(pool, child, pid, msg)
    # A payload that failed to unpickle keeps its traceback, whose frames
    # reach this one (f_back): holding the message here would make a cycle
    # that keeps the pool, and its processes' pipes, until a garbage collection.
    del msg
    return forwarded


def _forward(pool: ProcessPool, child: _Child, pid: int, msg: Message) -> bool:
    """Hand one received result to the consumer (pinned first when the loader pins). False: stop."""
    payload = msg.payload
    if pool._pin and type(payload) is Parcel:  # pinned here, so opened here
        payload = payload.open()
    # As DataLoader: a receive error from a worker that died (its file
    # descriptors went with it) is that worker's death, not the task's.
    if isinstance(payload, ReceiveError) and _failed_if_died(pool, child, pid):
        return False
    if pool._pin and msg.kind == Kind.DATA:
        stated = type(payload) is Stated
        batch = payload.payload if stated else payload
        if not isinstance(batch, ExceptionWrapper):
            batch = pin_task(batch, pool._pin_device, pool.counters[msg.worker_id], msg.worker_id)
        payload = payload._replace(payload=batch) if stated else batch
    pool.results.put(msg if payload is msg.payload else msg._replace(payload=payload))
    return True


def _failed_if_died(pool: ProcessPool, child: _Child, pid: int, detail: str = "") -> bool:
    """Whether ``child`` has exited (waiting for it briefly); if so, its workers die with its crash message.

    Args:
        detail: appended to the crash message (what failed on the way).
    """
    if not _exited(child):
        return False
    if not pool.stopping:
        crash = _crash_message(pid, _exit_code(child))
        pool.child_died(child, f"{crash.rstrip()} {detail}".strip() if detail else crash)
    return True


def _exited(child: _Child, timeout: float = POLL_S) -> bool:
    """Whether ``child`` has exited, waiting up to ``timeout`` seconds for it.

    Its sentinel answers as well as ``exitcode``: ``exitcode`` and ``join()``
    read as "running" while another thread reaps the same process (a user's
    ``join()`` on ``loader._workers``, ``multiprocessing.active_children()``):
    that thread's ``waitpid`` has it, this one's fails with ECHILD.
    ``exitcode`` still counts: a grandchild forked from the child holds its
    sentinel open after the child's death.
    """
    process = child.process
    return bool(mp_connection.wait([process.sentinel], timeout)) or process.exitcode is not None


def _exit_code(child: _Child) -> int | None:
    """The exit code of ``child``, which has exited (None: reaped by someone else, unknown)."""
    # Set by whichever thread reaped it, a moment after its sentinel became
    # ready; never, if something outside multiprocessing reaped it.
    deadline = time.monotonic() + EXIT_CODE_WAIT_S
    while (code := child.process.exitcode) is None and time.monotonic() < deadline:
        time.sleep(0.001)
    return code


def _crash_message(pid: int, exitcode: int | None) -> str:
    """How a worker process died, in the words of torch's check of its workers (empty for exit code 0)."""
    if exitcode is None:  # reaped outside multiprocessing: how it died is lost
        return f"DataLoader worker (pid {pid}) exited unexpectedly."
    if exitcode < 0:
        name = signal.strsignal(-exitcode) or f"Unknown signal {-exitcode}"
        text = f"DataLoader worker (pid {pid}) is killed by signal: {name}. "
        if -exitcode == signal.SIGBUS:
            text += ("It is possible that dataloader's workers are out of shared memory. "
                     "Please try to raise your shared memory limit.")
        return text
    if exitcode == 0:  # torch's check says nothing of a clean exit
        return ""
    return (f"DataLoader worker (pid {pid}) exited unexpectedly with exit code {exitcode}. "
            "Details are lost due to multiprocessing. Rerunning with num_workers=0 may give better error trace.")
