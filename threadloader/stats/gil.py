"""The GIL diagnosis: whether busy worker threads take turns on one GIL, and the warning that says so."""

from __future__ import annotations

import os
import statistics
import sys
import time
from types import FrameType
from typing import Any, NamedTuple

__all__ = ["ADAPT_CHECK_INTERVAL_S", "FREE_CORE_THRESHOLD", "GIL_CHECK_INTERVAL_S", "GIL_WARNING",
           "GIL_WARNING_PROCESSES", "GilBound", "Sample", "caller_stacklevel", "gil_bound", "gil_wait", "held_back",
           "verdict"]

#: Seconds between checks of whether the workers are GIL-bound.
GIL_CHECK_INTERVAL_S = 1.0

#: The same, for a pool that may move its workers into processes: it must
#: decide within the first seconds of an epoch.
ADAPT_CHECK_INTERVAL_S = 0.25

#: Idle cores (machine-wide, averaged over a window) below which the machine
#: counts as full: busy threads then wait for a core, not for the GIL.
FREE_CORE_THRESHOLD = 0.5

GIL_WARNING = (
    "ThreadDataLoader: the {workers} worker threads were busy {util:.0%} of the last {window:.1f}s but used only "
    "{cores:.2f} CPU cores together while the training loop waited for data{free}: the dataset's Python code "
    "most likely holds the GIL, so these threads take turns "
    "instead of running in parallel and more workers will not load faster. Release the GIL in the expensive "
    "step: do it in a library call that releases it (NumPy/torch operations, Pillow or "
    "threadloader.io.decode_image for images, zlib, file reads) instead of a Python loop, or spread the "
    "threads over worker processes with ThreadDataLoader(..., worker_processes=P)."
)

#: The same verdict for the threads of ``worker_processes`` children: each
#: process's threads take turns on that process's GIL.
GIL_WARNING_PROCESSES = (
    "ThreadDataLoader: the worker threads of {procs} of the {processes} worker processes were busy {util:.0%} of "
    "the last {window:.1f}s but each of those processes used only {cores:.2f} CPU cores while the training loop "
    "waited for data{free}: the dataset's Python code most likely holds the GIL, so the {threads} threads of a "
    "process take turns instead of running in parallel. Release the GIL in the expensive step (a library call "
    "that releases it instead of a Python loop), or run fewer threads per process: worker_processes={processes} "
    "now, at most num_workers={workers}."
)

#: The threadloader package's folder (this module's parent's parent).
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_TORCH_DATA_DIR = os.sep + os.path.join("torch", "utils", "data") + os.sep

class Sample(NamedTuple):
    """One sample of the counters, at the start or end of a window."""

    fetch: float  # the workers' fetch seconds
    cpu: float  # this process's CPU seconds
    wait: float  # the consumer's wait seconds
    system: Any  # the machine's CPU seconds (``cpu.system_cpu_seconds``)
    children: Any  # per child process: (its workers' fetch seconds, its CPU seconds)
    tasks: int = 0  # the tasks the workers finished


class GilBound(NamedTuple):
    """A window in which the workers looked GIL-bound: what a pool needs to decide what to do."""

    message: str  # the warning, as given when nothing is done about it
    window: float  # seconds
    cores: float  # CPU cores this process used in the window
    tasks: int  # tasks the workers finished in the window, and those running at its end

    @property
    def task_cpu_s(self) -> float:
        """CPU seconds per task in the window (infinite with no task finished)."""
        return self.cores * self.window / self.tasks if self.tasks else float("inf")


def caller_stacklevel() -> int:
    """``stacklevel`` that makes ``warnings`` name the user's line (the caller of ``next()``).

    Counted from the function calling this one, skipping threadloader's own
    frames and torch's data-loading frames between it and the user's code.
    """
    frame: FrameType | None = sys._getframe(2)  # the caller of the function that warns
    level = 2
    while frame is not None:
        name = os.path.abspath(frame.f_code.co_filename)
        if not (name.startswith(_PACKAGE_DIR) or _TORCH_DATA_DIR in name):
            return level
        frame = frame.f_back
        level += 1
    return 1


def gil_bound(util: float, cores: float, min_util: float = 0.6) -> bool:
    """Busy threads that together use about one core: they take turns on a GIL (False on NaN)."""
    return util >= min_util and 0.5 <= cores <= 1.15


#: The share of the cores the workers could use below which busy worker
#: threads count as held back (:func:`held_back`).
HELD_BACK_SHARE = 0.7

#: How long the consumer waits to take the GIL back, after giving it up for
#: a moment, before the GIL counts as contended: busy threads hold it (up to
#: a switch interval each); threads that wait for I/O do not.
CONTENDED_WAIT_S = 1e-4


#: A call that gives the GIL up for a moment and returns at once (``sched_yield``; ``sleep(0)``
#: sleeps out the timer slack, tens of microseconds, where there is no ``sched_yield``).
_GIVE_GIL_UP = getattr(os, "sched_yield", lambda: time.sleep(0))


def gil_wait(probes: int = 3) -> float:
    """Seconds the calling thread waits to take the GIL back after giving it up (the median of ``probes``)."""
    waits = []
    for _ in range(probes):
        t0 = time.perf_counter()
        _GIVE_GIL_UP()  # a thread that wants the GIL takes it now
        waits.append(time.perf_counter() - t0)
    return statistics.median(waits)


def _free_cores(before: Sample, after: Sample, usable_cores: int) -> float | None:
    """Cores that stood idle, on average, between two samples; None where the machine's CPU use is unknown."""
    if before.system is None or after.system is None or after.system[1] <= before.system[1]:
        return None
    return usable_cores - (after.system[0] - before.system[0]) / (after.system[1] - before.system[1])


def held_back(before: Sample, after: Sample, window: float, *, num_workers: int, usable_cores: int) -> str | None:
    """A wider test than :func:`verdict`, for a pool that may move its workers: threads the GIL holds back.

    On many cores, threads whose work holds the GIL part of the time use
    several cores but far fewer than they could. They count as held back
    when they are busy, the training loop waits for data, they use less than
    :data:`HELD_BACK_SHARE` of the cores they could use, at least
    :data:`FREE_CORE_THRESHOLD` of a core stands idle, and the GIL is
    contended (:func:`gil_wait`, read last: it costs the caller up to a few
    switch intervals). On two cores it also catches threads that use a
    little more than one core: the GIL-bound share of their work keeps the
    second one mostly idle.

    Returns:
        Why, in one line, or None.
    """
    util = (after.fetch - before.fetch) / (window * num_workers)
    cores = (after.cpu - before.cpu) / window
    # Busy from 0.4: GIL-bound threads also wait for it outside their fetch (posting, collating).
    if (after.wait - before.wait) / window < 0.25 or util < 0.4:
        return None
    if not 0.5 <= cores <= HELD_BACK_SHARE * min(num_workers, usable_cores):
        return None
    free = _free_cores(before, after, usable_cores)
    if free is not None and free < FREE_CORE_THRESHOLD:
        return None
    wait = gil_wait()
    if wait < CONTENDED_WAIT_S:
        return None
    return (f"the {num_workers} worker threads were busy {min(util, 1.0):.0%} of {window:.2f}s but used only "
            f"{cores:.2f} of {usable_cores} cores, and the GIL was contended ({wait * 1e3:.1f} ms to take it back)")


#: The busy share above which a child's threads count as busy. Lower than in
#: this process: a child's dispatcher needs its GIL to hand each job over, so
#: GIL-bound threads there also wait for jobs, outside their fetch, and so
#: look less busy.
_CHILD_MIN_UTIL = 0.4

#: The busy share from which a child's thread counts as one of its busy threads.
_CHILD_BUSY_THREAD = 0.25


def verdict(before: Sample, after: Sample, window: float, *, num_workers: int, usable_cores: int, narrowed: bool,
            workers_here: bool, group_sizes: list[int]) -> str | None:
    """The GIL warning for the window between two samples, or None: the workers do not look GIL-bound.

    Threads that run Python code take turns on the GIL: however many there
    are, together they use about one core, while each one looks busy
    (waiting for the GIL counts as busy). I/O-bound workers use little CPU,
    and code that releases the GIL -- or hands work to a library's own
    thread pool -- uses more than one core, so neither matches. The
    process's CPU time is used, so pools' threads count. A machine whose
    cores are all taken (by other processes too) looks the same from
    inside the process: busy threads, one core's worth of CPU. So the
    machine-wide CPU use is read beside the process's, and the dataset is
    blamed only when at least :data:`FREE_CORE_THRESHOLD` of a core stood
    idle. Nothing is said while the training loop rarely waits for data.
    Workers in ``worker_processes`` children cost this process no CPU: each
    child's dispatcher samples its own CPU time into the shared counters, and
    a child whose threads (two or more) are busy on about one core is
    GIL-bound the same way (one is enough for the warning, which then
    advises fewer threads per process).

    Args:
        before, after: the two samples (see :data:`Sample`).
        window: seconds between them (> 0).
        num_workers: the loader's workers.
        usable_cores: the cores this process may use.
        narrowed: whether those are fewer than the machine's (a CPU affinity).
        workers_here: the workers are threads of this process (else of children).
        group_sizes: the workers of each child process, in the samples' order.
    """
    fetch0, cpu0, wait0, _, children0, _ = before
    fetch1, cpu1, wait1, _, children1, _ = after
    if (wait1 - wait0) / window < 0.25:  # the training loop rarely waits: the loader is not the bottleneck
        return None
    if workers_here:
        util = (fetch1 - fetch0) / (window * num_workers)
        cores = (cpu1 - cpu0) / window
        if not gil_bound(util, cores):
            return None
        template, fields = GIL_WARNING, dict(workers=num_workers)
    else:
        # Each child's threads share that child's GIL; this process's CPU
        # time shows none of their work. One GIL-bound child is enough.
        bound = []
        for size, (f0, c0), (f1, c1) in zip(group_sizes, children0, children1):
            shares = [(b - a) / window for a, b in zip(f0, f1)]
            util, cores = sum(shares) / size, (c1 - c0) / window
            # Two threads or more must have been busy: one busy thread on one
            # core is no sign of the GIL, whatever the others do (idle, waiting).
            busy = sum(share >= _CHILD_BUSY_THREAD for share in shares)
            if busy >= 2 and gil_bound(util, cores, _CHILD_MIN_UTIL):
                bound.append((util, cores, size))
        if not bound:
            return None
        util, cores = min(b[0] for b in bound), max(b[1] for b in bound)
        template = GIL_WARNING_PROCESSES
        fields = dict(workers=num_workers, processes=len(group_sizes), procs=len(bound),
                      threads=max(b[2] for b in bound))
    free_text = ""
    free = _free_cores(before, after, usable_cores)
    if free is not None:
        if free < FREE_CORE_THRESHOLD:
            return None  # the machine is full: the threads wait for a core, not for the GIL
        where = "usable" if narrowed else "machine's"
        free_text = f" and {free:.1f} of the {where} {usable_cores} cores stood idle"
    return template.format(util=min(util, 1.0), window=window, cores=cores, free=free_text, **fields)
