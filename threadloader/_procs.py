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
which raises DataLoader's "exited unexpectedly" error instead of hanging.

Children never outlive the parent: they are daemonic (multiprocessing
terminates them at exit), they stop when told, the parent terminates any that
do not stop in time, and each child watches ``os.getppid()`` and, on Linux
when started from the main thread, asks the kernel for SIGTERM when its
parent dies (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import queue
import signal
import sys
import threading
import time
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as torch_mp

from . import _context
from ._engine import JOIN_BUDGET_S, ThreadPool
from ._worker_loop import _CRASHED, _DATA, _Config, _drain, pin_task
from ._torch_compat import ExceptionWrapper

__all__ = ["ProcessPool", "check_worker_processes"]

#: How often a child checks that its parent lives, and a receiver that its
#: child lives, while idle (seconds).
POLL_S = 0.1

#: Columns of the shared counters array (one row per worker).
_FETCH, _COLLATE, _PIN, _ITEMS, _TASKS, _BUSY = range(6)

#: Control messages on a child's job queue (besides ``(worker_id, job)``).
_NEW_EPOCH = -1


def check_worker_processes(worker_processes: Any, num_workers: int) -> None:
    """Validate ``worker_processes`` against ``num_workers``.

    Raises:
        ValueError: not an int, negative, more processes than workers, or
            processes without workers.
    """
    if isinstance(worker_processes, bool) or not isinstance(worker_processes, int):
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
    if worker_processes > num_workers:
        raise ValueError(
            f"worker_processes option should be at most num_workers (each process runs at least one worker "
            f"thread), but got worker_processes={worker_processes} and num_workers={num_workers}."
        )


class ArrayCounters:
    """One worker's :class:`threadloader.stats.WorkerCounters`, as a row of a shared array.

    The child's worker thread writes every column but ``pin_s``, which the
    parent's receiver writes; readers get approximate values, as with threads.
    """

    __slots__ = ("_row",)

    def __init__(self, array: np.ndarray, worker_id: int) -> None:
        self._row = array[worker_id]

    def _get(col: int, cast: type = float) -> property:  # type: ignore[misc]  # noqa: N805
        def get(self: ArrayCounters) -> Any:
            return cast(self._row[col])

        def set_(self: ArrayCounters, value: Any) -> None:
            self._row[col] = value

        return property(get, set_)

    fetch_s = _get(_FETCH)
    collate_s = _get(_COLLATE)
    pin_s = _get(_PIN)
    items = _get(_ITEMS, int)
    tasks = _get(_TASKS, int)
    busy = _get(_BUSY, bool)
    del _get


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


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    # Raised in the child's main thread (the dispatcher): it unwinds through
    # its finally, which stops the threads, and the process exits cleanly.
    raise SystemExit(0)


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
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle, as in DataLoader
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if death_signal:
        _set_parent_death_signal()
    if os.getppid() != parent_pid:  # the parent died before the signal was set up
        return
    _context.mark_child_process()
    torch.set_num_threads(1)  # as DataLoader's workers: no intra-op pool per process
    array = counters.numpy()
    pool = ThreadPool(cfg, worker_ids, results, {w: ArrayCounters(array, w) for w in worker_ids})
    try:
        while True:
            try:
                msg = jobs.get(timeout=POLL_S)
            except queue.Empty:
                if os.getppid() != parent_pid:
                    return  # orphaned (the parent was killed)
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
        self._ctx = mp_context if mp_context is not None else torch_mp
        self._pin = cfg.pin
        self._pin_device = cfg.pin_device
        self._device_index = cfg.device_index
        self.results: queue.SimpleQueue = queue.SimpleQueue()
        self.generation = 0
        self.stopping = False
        self._stopped = False
        num_workers = cfg.num_workers
        self._counter_tensor = torch.zeros((num_workers, 6), dtype=torch.float64).share_memory_()
        array = self._counter_tensor.numpy()
        self.counters = [ArrayCounters(array, w) for w in range(num_workers)]
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
                child.process.start()
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
        """Queue ``(task, generation, index)`` for worker ``worker_id`` (in its process)."""
        self._by_worker[worker_id].jobs.put((worker_id, job))

    def new_epoch(self, generation: int | None = None) -> None:
        """Start a new generation: children drop the jobs queued before it."""
        self.generation = self.generation + 1 if generation is None else generation
        for child in self._children:
            child.jobs.put((_NEW_EPOCH, self.generation))

    @property
    def workers(self) -> list[Any]:
        """The process each worker runs in, in worker order (DataLoader's ``_workers`` shape)."""
        return [self._by_worker[w].process for w in sorted(self._by_worker)]

    def stop(self) -> None:
        """Stop the children and the receivers; terminate what does not stop in time (idempotent)."""
        if self._stopped:
            return
        self._stopped = self.stopping = True
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
            if child.process is not None and child.process.exitcode is not None:
                child.process.close()
        _drain(self.results)


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
                pool.results.put((_CRASHED, -1, -1, -1, _crash_message(pid, child.process.exitcode)))
            return False
        return True
    except Exception as exc:  # noqa: BLE001 - a result that cannot be received
        if not pool.stopping:
            pool.results.put((_CRASHED, -1, -1, -1, f"DataLoader worker (pid(s) {pid}) exited unexpectedly: "
                                                    f"receiving its result failed: {exc!r}"))
        return False
    if pool.stopping:
        return False
    kind, gen, idx, worker_id, payload = msg
    del msg
    if pool._pin and kind == _DATA and not isinstance(payload, ExceptionWrapper):
        payload = pin_task(payload, pool._pin_device, pool.counters[worker_id], worker_id)
    pool.results.put((kind, gen, idx, worker_id, payload))
    return True


def _crash_message(pid: int, exitcode: int) -> str:
    """DataLoader's message for a worker process that died, with its exit status."""
    if exitcode < 0:
        try:
            how = f"killed by signal: {signal.Signals(-exitcode).name}"
        except ValueError:
            how = f"killed by signal {-exitcode}"
    else:
        how = f"exit code {exitcode}"
    return f"DataLoader worker (pid(s) {pid}) exited unexpectedly ({how})"
