"""The process layer: a loader's worker threads spread over child processes.

With ``worker_processes=P`` the ``num_workers`` workers run as threads of P
child processes started through ``torch.multiprocessing`` (the loader's
``multiprocessing_context`` when given, else torch's default start method).
Worker ``w`` lives in process ``w % P``: tasks go to workers round robin (as in
DataLoader), so consecutive tasks go to different processes.

Inside a child, a :class:`threadloader._engine.ThreadPool` runs that
process's workers exactly as the thread engine runs them in-process (same
worker info with global ids and ``num_workers``, seeds, ``worker_init_fn``,
error wrapping). The child's main thread is its dispatcher: it reads jobs from
the process's job queue and hands them to its threads, and watches its parent.
Batches are collated in shared memory in the child (``default_collate`` and
``frame_collate`` do so when :func:`threadloader._context.batches_cross_processes`
is True), so ``torch.multiprocessing``'s queue sends only a handle to them.

In the parent, one receiver thread per child reads that child's result queue,
pins the batch when the loader pins (off the consumer thread), and forwards it
to the one result queue the consumer reads, so the consumer cannot tell threads
from processes. A receiver also notices its child dying and tells the consumer,
which raises DataLoader's "exited unexpectedly" error instead of hanging. Each
result's payload is pickled on its own (:class:`_Parcel`), so a payload that
cannot be unpickled here is an error of its task, not of the whole channel.

Children never outlive the parent: they are daemonic (multiprocessing
terminates them at exit), they stop when told, the parent terminates any that
do not stop in time, and each child watches the loader's process. It polls
``multiprocessing.parent_process()``, whose sentinel is a pipe only the
loader's process holds open (EOF when it dies, whatever the start method);
where the loader's process is its direct parent (fork, spawn; not forkserver,
whose server forks the children) it also watches ``os.getppid()`` and, on
Linux when started from the main thread, asks the kernel for SIGTERM when its
parent dies (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import io
import multiprocessing
import numbers
import operator
import os
import pickle
import queue
import signal
import sys
import threading
import time
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as torch_mp

from . import _context, _torch_compat, worker
from ._engine import JOIN_BUDGET_S, ThreadPool
from ._worker_loop import _CRASHED, _DATA, _DIED, STOPPED_MESSAGE, ProcessDeath, _Config, _drain, pin_task
from ._torch_compat import ExceptionWrapper, set_worker_signal_handlers
from .stats import WorkerCounters, process_cpu_seconds

__all__ = ["ProcessPool", "check_worker_processes"]

#: How often a child checks that its parent lives, and a receiver that its
#: child lives, while idle (seconds).
POLL_S = 0.1

#: Columns of the shared counters array (one row per worker). ``_CPU``: the
#: CPU time of the worker's process, written by that process's dispatcher.
_FETCH, _COLLATE, _PIN, _EPOCH, _EPOCH_ITEMS, _TASKS, _BUSY, _CPU = range(8)

#: Control messages on a child's job queue (besides ``(worker_id, job)``).
_NEW_EPOCH = -1

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
    """Validate ``worker_processes`` against ``num_workers``.

    Raises:
        ValueError: not an integer (any ``numbers.Integral`` but bool, as
            DataLoader takes NumPy ints for ``num_workers``), negative, more
            processes than workers, or processes without workers.
    """
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


class ArrayCounters:
    """One worker's :class:`threadloader.stats.WorkerCounters`, as a row of a shared array.

    The child's worker thread writes every column but ``pin_s``, which the
    parent's receiver writes, and ``process_cpu_s``, which the child's
    dispatcher writes; readers get approximate values, as with threads.

    Args:
        array: the shared array, one row per worker.
        worker_id: this worker's row.
        process: the index of the child process the worker runs in (stats'
            GIL check looks at each process's threads together).
    """

    __slots__ = ("_row", "process")

    #: The worker runs in a child: the parent's CPU time does not show it (stats' GIL check).
    in_this_process = False

    def __init__(self, array: np.ndarray, worker_id: int, process: int = 0) -> None:
        self._row = array[worker_id]
        self.process = process

    def detach(self) -> None:
        """Keep the row in private memory from now on (the children are gone)."""
        self._row = self._row.copy()

    def _get(col: int, cast: type = float) -> property:  # type: ignore[misc]  # noqa: N805
        def get(self: ArrayCounters) -> Any:
            return cast(self._row[col])

        def set_(self: ArrayCounters, value: Any) -> None:
            self._row[col] = value

        return property(get, set_)

    fetch_s = _get(_FETCH)
    collate_s = _get(_COLLATE)
    pin_s = _get(_PIN)
    epoch = _get(_EPOCH, int)
    epoch_items = _get(_EPOCH_ITEMS, int)
    tasks = _get(_TASKS, int)
    busy = _get(_BUSY, bool)
    #: CPU seconds of the worker's whole process (all its threads), as last sampled by its dispatcher.
    process_cpu_s = _get(_CPU)
    del _get
    fetched = WorkerCounters.fetched


# --- child side ------------------------------------------------------------------

def _set_parent_death_signal() -> None:
    """Ask Linux to send SIGTERM to this process when its parent thread dies."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - no prctl: the watchdog still runs
        pass


def _ignore_sigint(signum: int, frame: Any) -> None:
    pass


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    # Raised in the child's main thread (the dispatcher): it unwinds through
    # its finally, which stops the threads, and the process exits cleanly.
    raise SystemExit(0)


def _loader_alive(parent_pid: int | None) -> bool:
    """Whether the loader's process still lives (checked from a child).

    Args:
        parent_pid: the loader's pid when it is this process's direct parent
            (fork, spawn), else None (forkserver: the forkserver is the parent).
    """
    if parent_pid is not None and os.getppid() != parent_pid:
        return False
    # Its sentinel is a pipe whose write end only the process that started this
    # one holds: it reads as ready (EOF) once that process is gone.
    parent = multiprocessing.parent_process()
    return parent is None or parent.is_alive()


class _Parcel:
    """A result's payload, pickled on its own inside the result message.

    If the parent cannot unpickle the payload (a ``__reduce__`` that fails
    there, file descriptors running out while receiving a tensor...), the
    message around it still arrives, so the error belongs to its task and
    the channel stays usable, as in DataLoader, whose queue ``get`` raises the
    error while the worker goes on.
    """

    __slots__ = ("payload", "worker_id")

    def __init__(self, payload: Any, worker_id: int) -> None:
        self.payload = payload
        self.worker_id = worker_id

    def __reduce__(self) -> tuple[Any, tuple[bytes, int]]:
        # Runs in the queue's feeder thread, where the message is pickled.
        try:
            data = _dumps(self.payload)
        except Exception:  # noqa: BLE001 - unpicklable result: its task fails instead of never arriving
            where = f"in DataLoader worker thread {self.worker_id} (sending its result from process {os.getpid()})"
            data = _dumps(ExceptionWrapper(where=where))
        return _unparcel, (data, os.getpid())


class WorkerExitStandIn(BaseException):
    """Stands in the parent for the exception that ended a worker thread in a child process.

    Used when that exception cannot travel (it does not pickle there, or not
    unpickle here): ``repr()`` gives the original's, so the "exited
    unexpectedly" error still names it.
    """

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __repr__(self) -> str:
        return self.text


class _Death:
    """The exception that ended a worker thread, as it travels to the parent (see :class:`_Parcel`).

    Its message must arrive whatever the exception holds: a lost one would
    leave the consumer waiting for that worker's tasks for ever.
    """

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        text = _safe_repr(self.exc)
        try:
            return _undeath, (_dumps(self.exc), text)
        except Exception:  # noqa: BLE001 - unpicklable: its repr travels instead
            return WorkerExitStandIn, (text,)


def _safe_repr(obj: Any) -> str:
    try:
        return repr(obj)
    except Exception:  # noqa: BLE001
        return f"<{type(obj).__name__} object>"


def _undeath(data: bytes, text: str) -> BaseException:
    """Unpickle a :class:`_Death` (in the parent); one that fails gives its stand-in."""
    try:
        exc = ForkingPickler.loads(data)
    except Exception:  # noqa: BLE001 - e.g. a required __init__ argument
        return WorkerExitStandIn(text)
    return exc if isinstance(exc, BaseException) else WorkerExitStandIn(text)


def _dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    ForkingPickler(buf).dump(obj)  # torch's reductions: tensors travel as shared-memory handles
    return buf.getvalue()


def _unparcel(data: bytes, pid: int) -> Any:
    """Unpickle a :class:`_Parcel` (in the parent); a failure becomes the task's error."""
    try:
        return ForkingPickler.loads(data)
    except Exception as exc:  # noqa: BLE001 - raised to the consumer for this task
        return _ReceiveError(exc, pid)


#: DataLoader's error when a result cannot be received for want of file
#: descriptors (torch.utils.data.dataloader), word for word.
TOO_MANY_OPEN_FILES = (
    "Too many open files. Communication with the workers is no longer possible. Please increase the "
    "limit using `ulimit -n` in the shell or change the sharing strategy by calling "
    "`torch.multiprocessing.set_sharing_strategy('file_system')` at the beginning of your code"
)

#: Files that must still open for a failure not to be blamed on the descriptor limit (DataLoader's margin).
_FD_MARGIN = 10


def _out_of_fds() -> bool:
    """Whether this process is within :data:`_FD_MARGIN` of its open-files limit, as DataLoader tests it."""
    import tempfile

    try:
        with contextlib.ExitStack() as stack:
            for _ in range(_FD_MARGIN):
                stack.enter_context(tempfile.TemporaryFile())
    except OSError as e:
        return e.errno == errno.EMFILE
    return False


class _ReceiveError(ExceptionWrapper):
    """A result the loader's process could not unpickle: its task raises the unpickling error itself.

    DataLoader re-raises that exception, unchanged, from ``next()``; so does
    this (an :class:`ExceptionWrapper`, so the consumer calls :meth:`reraise`),
    with a note saying which worker process sent the result.
    """

    def __init__(self, exc: Exception, pid: int) -> None:
        where = f"in the loader's process, receiving a result from DataLoader worker process (pid {pid})"
        super().__init__((type(exc), exc, exc.__traceback__), where=where)
        if hasattr(exc, "add_note"):  # Python 3.11+
            exc.add_note(f"Raised {where}; the worker process is still running.")
        self.exc: BaseException | None = exc
        # Checked now, where it failed: received tensors each hold a descriptor.
        self.out_of_fds = _out_of_fds()

    def reraise(self) -> None:
        if self.out_of_fds:
            # DataLoader's advice in place of the unpickler's ("received 0 items of ancdata").
            self.exc = None
            raise RuntimeError(TOO_MANY_OPEN_FILES) from None
        exc, self.exc = self.exc, None  # raised once; no cycle through this wrapper
        if exc is None:
            super().reraise()
        try:
            raise exc
        finally:
            exc = None


class _ParcelQueue:
    """The child's result queue as its worker threads see it: data payloads travel as :class:`_Parcel`,
    the exceptions that end worker threads as :class:`_Death`."""

    __slots__ = ("_queue",)

    def __init__(self, results: Any) -> None:
        self._queue = results

    def put(self, msg: tuple[int, int, int, int, Any]) -> None:
        kind, gen, idx, worker_id, payload = msg
        if kind == _DATA:
            payload = _Parcel(payload, worker_id)
        elif kind == _DIED:
            payload = _Death(payload)
        self._queue.put((kind, gen, idx, worker_id, payload))


def _child_main(
    cfg: _Config,
    worker_ids: list[int],
    jobs: Any,
    results: Any,
    counters: torch.Tensor,
    parent_pid: int,
    death_signal: bool,
) -> None:
    """Body of one worker process: run its worker threads until told to stop or orphaned."""
    # Ctrl-C is the parent's to handle. A handler that does nothing, not
    # SIG_IGN: an ignored signal stays ignored across exec, in every program
    # the dataset runs (ffmpeg would ignore Ctrl-C); a handler does not.
    signal.signal(signal.SIGINT, _ignore_sigint)
    # As DataLoader's workers: a bus error or segfault says so on stderr first
    # ("... insufficient shared memory (shm)"). Then SIGTERM gets ours again.
    set_worker_signal_handlers()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    # Under forkserver our parent is the forkserver, not the loader's process:
    # only the sentinel (see _loader_alive) watches the loader then.
    direct_parent = parent_pid if os.getppid() == parent_pid else None
    if death_signal and direct_parent is not None:
        _set_parent_death_signal()
    if not _loader_alive(direct_parent):  # it died before the signal was set up
        return
    _context.mark_child_process()
    torch.set_num_threads(1)  # as DataLoader's workers: no intra-op pool per process
    # Threads the workers start use the process's generators: seeded per
    # child (DataLoader's seeds when the child holds one worker), not the
    # parent's copy in every child.
    worker.seed_process(cfg.base_seed, worker_ids[0])
    cfg = dataclasses.replace(cfg, owns_process=len(worker_ids) == 1)
    array = counters.numpy()
    pool = ThreadPool(cfg, worker_ids, _ParcelQueue(results), {w: ArrayCounters(array, w) for w in worker_ids})
    try:
        while True:
            # This process's CPU time, for the parent's GIL check (stats): fresh
            # to within a job or POLL_S, against its windows of seconds.
            array[worker_ids, _CPU] = process_cpu_seconds()
            try:
                msg = jobs.get(timeout=POLL_S)
            except queue.Empty:
                if not _loader_alive(direct_parent):
                    return  # orphaned (the loader's process was killed)
                continue
            if msg is None:
                return
            worker_id, job = msg
            if worker_id == _NEW_EPOCH:
                pool.new_epoch(job)
            else:
                pool.submit(worker_id, job)
    finally:
        # Never wait to flush results nobody will read.
        results.cancel_join_thread()
        pool.stop()


# --- parent side -----------------------------------------------------------------

class _Child:
    """One worker process and the parent's ends of its queues."""

    def __init__(self, ctx: Any, index: int, worker_ids: list[int]) -> None:
        self.index = index
        self.worker_ids = worker_ids
        self.jobs = ctx.Queue()
        # As DataLoader's index queues: at this process's exit, multiprocessing
        # must not wait for a feeder thread still writing jobs to a child it
        # has just terminated (the exit would hang, pytorch#48666).
        self.jobs.cancel_join_thread()
        self.results = ctx.Queue()
        self.process: Any = None
        self.receiver: threading.Thread | None = None


class ProcessPool:
    """The pool interface of :class:`threadloader._engine.ThreadPool`, over child processes.

    Args:
        cfg: what every worker needs (pinning, if asked, happens in the parent).
        num_processes: P, 1 .. ``cfg.num_workers``.
        mp_context: the loader's ``multiprocessing_context`` (None: torch's default).
    """

    def __init__(self, cfg: _Config, num_processes: int, mp_context: Any = None) -> None:
        num_processes = operator.index(num_processes)  # a NumPy int too
        self._ctx = mp_context if mp_context is not None else torch_mp
        self._pin = cfg.pin
        self._pin_device = cfg.pin_device
        self._device_index = cfg.device_index
        self.results: queue.SimpleQueue = queue.SimpleQueue()
        self.generation = 0
        self.stopping = False
        self._stopped = False
        self._owner_pid = os.getpid()
        #: Why the pool failed (the consumer's RuntimeError message), once it has.
        self.failure: str | None = None
        self._failure_lock = threading.Lock()
        num_workers = cfg.num_workers
        workers = range(num_workers)  # first: a float gives DataLoader's TypeError, as with threads
        self._counter_tensor = torch.zeros((len(workers), _CPU + 1), dtype=torch.float64).share_memory_()
        array = self._counter_tensor.numpy()
        self.counters = [ArrayCounters(array, w, w % num_processes) for w in workers]
        child_cfg = dataclasses.replace(cfg, pin=False, device_index=None)
        # A parent-death signal fires when the *thread* that forked exits: only
        # ask for it when that thread is the main thread (its end is the process's).
        death_signal = threading.current_thread() is threading.main_thread()
        self._children: list[_Child] = []
        try:
            for p in range(num_processes):
                child = _Child(self._ctx, p, list(range(p, num_workers, num_processes)))
                self._children.append(child)
                child.process = self._ctx.Process(
                    target=_child_main,
                    args=(child_cfg, child.worker_ids, child.jobs, child.results, self._counter_tensor,
                          os.getpid(), death_signal),
                    name=f"threadloader-process-{p}",
                    daemon=True,
                )
                _start(child.process)
                _close_writing_end(child.results)
            for child in self._children:
                child.receiver = threading.Thread(
                    target=_receive, args=(self, child), name=f"threadloader-receiver-{child.index}", daemon=True
                )
                child.receiver.start()
        except BaseException:
            self.stop()
            raise
        self._by_worker = {w: c for c in self._children for w in c.worker_ids}

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids."""
        return [c.process.pid for c in self._children if c.process is not None]

    def submit(self, worker_id: int, job: tuple[int, int, Any]) -> None:
        """Queue ``(task, generation, index)`` for worker ``worker_id`` (in its process).

        Raises:
            RuntimeError: the pool was stopped (the failure's message when a
                worker process died), never an error of a closed queue.
        """
        if self._stopped:
            raise RuntimeError(self.failure or STOPPED_MESSAGE)
        self._by_worker[worker_id].jobs.put((worker_id, job))

    def new_epoch(self, generation: int | None = None) -> None:
        """Start a new generation: results of older ones are stale from now on.

        Each child's threads still run the jobs queued before it, in order
        (see ``ThreadPool.new_epoch``); the consumer drops their results.

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
            child.jobs.put((_NEW_EPOCH, self.generation))

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
        pid = child.process.pid
        death = ProcessDeath(f"DataLoader worker (pid(s) {pid}) exited unexpectedly", tuple(child.worker_ids), detail)
        self.results.put((_DIED, self.generation, -1, child.worker_ids[0], death))

    def fail(self, message: str) -> None:
        """Record the pool's failure and tell the consumer (its first failure wins, in both)."""
        with self._failure_lock:
            if self.failure is None:
                self.failure = message
            self.results.put((_CRASHED, -1, -1, -1, message))

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
        for child in started:
            try:
                child.jobs.put(None)
            except (OSError, ValueError):  # pragma: no cover - queue already closed
                pass
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
                child.process.join()
        current = threading.current_thread()
        for child in self._children:
            if child.receiver is current:  # stopped from its own receiver (GC there): it exits next
                continue
            if child.receiver is not None:
                child.receiver.join()
            for q in (child.jobs, child.results):
                q.cancel_join_thread()
                q.close()
            # The Process objects stay open (DataLoader never closes its
            # workers either): ``_workers`` must keep answering. Their pipes
            # close when the pool is collected.
        _drain(self.results)
        # The loader keeps its last stats, and with them these counters: give
        # them private memory, or each loader kept would hold the shared
        # array (an open file descriptor) for as long as it lives.
        for counters in self.counters:
            counters.detach()
        self._counter_tensor = None


def _start(process: Any) -> None:
    """Start one worker process, warning as DataLoader does when its arguments do not pickle."""
    try:
        process.start()
    except (TypeError, AttributeError, pickle.PicklingError):
        _torch_compat.warn_as_worker_start(PICKLE_WARNING)
        raise


def _close_writing_end(results: Any) -> None:
    """Close this process's copy of the write end of a child's result queue (the child has its own).

    Then a child that dies in the middle of writing a result leaves its
    receiver an end of file, not a read that waits for ever for the rest of
    the message. Closed right after the child started: children started later
    (and any other process forked from this one) do not inherit it either.
    """
    writer = getattr(results, "_writer", None)  # multiprocessing.Queue's end (not public API)
    if writer is not None:
        writer.close()


def _receive(pool: ProcessPool, child: _Child) -> None:
    """Body of a receiver thread: forward one child's results to the consumer."""
    if pool._pin and pool._device_index is not None:
        torch.accelerator.set_device_index(pool._device_index)
    pid = child.process.pid
    while _receive_one(pool, child, pid):
        pass


def _receive_one(pool: ProcessPool, child: _Child, pid: int) -> bool:
    """Forward one result (a function so that an idle receiver holds no batch). False: stop."""
    try:
        msg = child.results.get(timeout=POLL_S)
    except queue.Empty:
        if pool.stopping:
            return False
        if child.process.exitcode is not None:
            # Re-check: results it posted just before dying are delivered first.
            if not child.results.empty():
                return True
            if not pool.stopping:
                pool.child_died(child, _crash_message(pid, child.process.exitcode))
            return False
        return True
    except Exception as exc:  # noqa: BLE001 - the channel itself broke (payloads fail as their task: _Parcel)
        # A broken pipe is most often a child that just died. A clean end of
        # file says nothing more than its death (only the child wrote there).
        detail = "" if isinstance(exc, EOFError) else f"Receiving its result failed: {exc!r}"
        if not pool.stopping and not _failed_if_died(pool, child, pid, detail):
            pool.fail(f"Receiving a result from DataLoader worker process (pid {pid}) failed: {exc!r}")
        return False
    forwarded = not pool.stopping and _forward(pool, child, pid, msg)
    # A payload that failed to unpickle keeps its traceback, whose frames
    # reach this one (f_back): holding the message here would make a cycle
    # that keeps the pool, and its processes' pipes, until a garbage collection.
    del msg
    return forwarded


def _forward(pool: ProcessPool, child: _Child, pid: int, msg: tuple[int, int, int, int, Any]) -> bool:
    """Hand one received result to the consumer (pinned first when the loader pins). False: stop."""
    kind, gen, idx, worker_id, payload = msg
    # As DataLoader: a receive error from a worker that died (its file
    # descriptors went with it) is that worker's death, not the task's.
    if isinstance(payload, _ReceiveError) and _failed_if_died(pool, child, pid):
        return False
    if pool._pin and kind == _DATA and not isinstance(payload, ExceptionWrapper):
        payload = pin_task(payload, pool._pin_device, pool.counters[worker_id], worker_id)
    pool.results.put((kind, gen, idx, worker_id, payload))
    return True


def _failed_if_died(pool: ProcessPool, child: _Child, pid: int, detail: str = "") -> bool:
    """Whether ``child`` has exited (waiting for it briefly); if so, its workers die with its crash message.

    Args:
        detail: appended to the crash message (what failed on the way).
    """
    child.process.join(timeout=POLL_S)
    exitcode = child.process.exitcode
    if exitcode is None:
        return False
    if not pool.stopping:
        crash = _crash_message(pid, exitcode)
        pool.child_died(child, f"{crash.rstrip()} {detail}".strip() if detail else crash)
    return True


def _crash_message(pid: int, exitcode: int) -> str:
    """How a worker process died, in the words of torch's check of its workers (empty for exit code 0)."""
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
