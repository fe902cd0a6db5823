"""The body of a ``worker_processes`` child: its dispatcher, its worker threads, its watch on the parent.

The child's main thread is its dispatcher: it reads jobs from the process's
job queue and hands them to a :class:`threadloader.engine.thread_pool.ThreadPool`
running that process's workers exactly as the thread engine runs them
in-process (same worker info with global ids and ``num_workers``, seeds,
``worker_init_fn``, error wrapping), and watches the loader's process. A
child holding one worker runs it in its main thread instead (:mod:`.inline`),
whose wait for a job does the dispatcher's reading. It
polls ``multiprocessing.parent_process()``, whose sentinel is a pipe only the
loader's process holds open (EOF when it dies, whatever the start method);
where the loader's process is its direct parent (fork, spawn; not forkserver,
whose server forks the children) it also watches ``os.getppid()`` and, on
Linux when started from the main thread, asks the kernel for SIGTERM when its
parent dies (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import gc
import multiprocessing
import os
import signal
import sys
from typing import Any

import torch

from .._platform.interpreter import FREE_THREADED_BUILD
from .._platform.torch_compat import set_worker_signal_handlers
from ..engine.protocol import WorkerConfig
from ..engine.thread_pool import ThreadPool
from ..stats.cpu import process_cpu_seconds
from ..worker import context as _context
from ..worker import info as worker
from .arena import ChildArena
from .counters import CPU, ArrayCounters
from .inline import Dispatcher, InlineShared, run_inline
from .pipe_queue import PipeQueue
from .wire import ParcelQueue

__all__ = ["POLL_S", "child_main"]

#: How often a child checks that its parent lives, and a receiver that its
#: child lives, while idle (seconds).
POLL_S = 0.1


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


def _stop_on_sigterm(shared: InlineShared, signum: int, frame: Any) -> None:
    # As _exit_on_sigterm, for a worker run in this thread: it is stopping,
    # so the SystemExit that unwinds the worker loop is no death of its worker.
    shared.stopping = True
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


def child_main(
    cfg: WorkerConfig,
    worker_ids: list[int],
    jobs: PipeQueue,
    results: PipeQueue,
    counters: torch.Tensor,
    parent_pid: int,
    death_signal: bool,
    arena_token: str,
    arena_batches: int,
) -> None:
    """Body of one worker process: run its worker threads until told to stop or orphaned."""
    array = counters.numpy()
    # The first sign of life, which the parent awaits from a forked child
    # (ProcessPool._fork_again_where_hung): the child got past its fork.
    array[worker_ids[0], CPU] = process_cpu_seconds()
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
    results.begin_writing()  # a forked child holds the parent's copy as it was
    arena = ChildArena(arena_token, arena_batches)
    _context.mark_child_process(arena)
    torch.set_num_threads(1)  # as DataLoader's workers: no intra-op pool per process
    # Threads the workers start use the process's generators: seeded per
    # child (DataLoader's seeds when the child holds one worker), not the
    # parent's copy in every child.
    worker.seed_process(cfg.base_seed, worker_ids[0])
    cfg = dataclasses.replace(cfg, owns_process=len(worker_ids) == 1)
    rows = {w: ArrayCounters(array, w) for w in worker_ids}
    dispatcher = Dispatcher(jobs, arena, array, worker_ids[0], lambda: _loader_alive(direct_parent), POLL_S)
    pool: ThreadPool | InlineShared
    if cfg.owns_process:  # its one worker runs in this thread: no hand-off between threads per job
        pool = InlineShared(worker_ids[0], ParcelQueue(results), rows, dispatcher)
        signal.signal(signal.SIGTERM, functools.partial(_stop_on_sigterm, pool))
    else:
        pool = ThreadPool(cfg, worker_ids, ParcelQueue(results), rows)
    try:
        if isinstance(pool, InlineShared):
            run_inline(cfg, worker_ids[0], pool)
        else:
            while (got := dispatcher.next(pool)) is not None:
                pool.submit(*got)
    finally:
        if not isinstance(pool, InlineShared):
            pool.stop()
        dispatcher.close()  # it writes to the counters, let go of below
        # The process ends in os._exit, where nothing is collected: under the
        # file_system sharing strategy a segment still mapped then stays in
        # /dev/shm until the loader's process exits. Let go of both.
        arena.close()
        for row in rows.values():
            row.detach()
        del array
        counters.set_()  # the Process object's arguments hold this tensor (spawn, forkserver)
        # On a free-threaded build an object another thread let go of may be
        # freed only at a collection (biased reference counting, see
        # _interpreter): there the blocks above stayed in /dev/shm without
        # one. Only then: a collection touches every object, and in a forked
        # child that copies the pages it shares with the loader's process.
        if FREE_THREADED_BUILD and torch.multiprocessing.get_sharing_strategy() == "file_system":
            gc.collect()
