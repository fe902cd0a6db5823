"""Counters that tell a user where an iterator's time goes.

Each worker thread writes only its own :class:`WorkerCounters`; the consumer
writes only :class:`LoaderStats`' own fields. Reading a snapshot while workers
run gives approximate (never torn per field) values, which is what a progress
report needs; no lock is taken on the hot path.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar

from ._fork import renew_lock_after_fork
from ._interpreter import gil_enabled

#: Seconds between checks of whether the workers are GIL-bound.
GIL_CHECK_INTERVAL_S = 1.0

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

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_TORCH_DATA_DIR = os.sep + os.path.join("torch", "utils", "data") + os.sep


def usable_cpus() -> list[int] | None:
    """The CPUs this process may run on (its affinity: taskset, containers, SLURM), or None if unknown."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return None


def system_cpu_seconds(cpus: list[int] | None = None) -> tuple[float, float] | None:
    """CPU time of the machine, or of ``cpus`` only: ``(busy seconds summed over cores, wall-clock reference)``.

    ``busy`` counts every process's CPU use (user, system, interrupts, steal),
    not idle or I/O wait. Read from psutil when installed, else Linux's
    ``/proc/stat``; None where neither is available (the caller then cannot
    tell a full machine from a GIL-bound process, and assumes a free core).
    """
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        try:
            if cpus is None:
                times = [psutil.cpu_times()]
            else:
                per_cpu = psutil.cpu_times(percpu=True)
                times = [per_cpu[i] for i in cpus if i < len(per_cpu)]
            busy = 0.0
            for t in times:
                idle = t.idle + getattr(t, "iowait", 0.0)
                # guest time is already inside user time on Linux
                busy += sum(t) - idle - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
            return busy, time.perf_counter()
        except Exception:  # noqa: BLE001 - any platform oddity: fall through to /proc/stat
            pass
    wanted = {b"cpu"} if cpus is None else {b"cpu%d" % i for i in cpus}
    try:
        with open("/proc/stat", "rb") as f:
            rows = [line.split() for line in f if line.startswith(b"cpu")]
        hz = os.sysconf("SC_CLK_TCK")
        busy_ticks = 0
        for fields in rows:
            if fields[0] in wanted:
                ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
                busy_ticks += sum(ticks) - ticks[3] - ticks[4]
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return busy_ticks / hz, time.perf_counter()


def process_cpu_seconds() -> float:
    """CPU time of this process, every thread (library thread pools included)."""
    return time.process_time()


def _caller_stacklevel() -> int:
    """``stacklevel`` that makes ``warnings`` name the user's line (the caller of ``next()``).

    Counted from the function calling this one, skipping threadloader's own
    frames and torch's data-loading frames between it and the user's code.
    """
    frame = sys._getframe(2)  # the caller of the function that warns
    level = 2
    while frame is not None:
        name = os.path.abspath(frame.f_code.co_filename)
        if not (name.startswith(_PACKAGE_DIR) or _TORCH_DATA_DIR in name):
            return level
        frame = frame.f_back
        level += 1
    return 1


@dataclass
class WorkerCounters:
    """Time and work of one worker thread (written by that thread only)."""

    #: Whether the worker runs in this process, whose CPU time the GIL check
    #: reads (``worker_processes`` counters say False).
    in_this_process: ClassVar[bool] = True

    fetch_s: float = 0.0
    collate_s: float = 0.0
    pin_s: float = 0.0
    #: The generation (epoch) of the last task counted, and the samples this
    #: worker fetched for it. Kept per generation, not as a running total
    #: with a baseline: after a ``break``, a persistent worker still runs the
    #: abandoned epoch's queued tasks, at times the consumer cannot know.
    epoch: int = 0
    epoch_items: int = 0
    tasks: int = 0
    busy: bool = False

    def fetched(self, generation: int, items: int) -> None:
        """Count ``items`` samples fetched for a task of ``generation``.

        A worker's tasks arrive in submission order, so its generations
        never go back.
        """
        if generation != self.epoch:
            # Count reset first: a reader in between never sees the old
            # epoch's count under the new epoch.
            self.epoch_items = 0
            self.epoch = generation
        self.epoch_items += items


def _gil_bound(util: float, cores: float, min_util: float = 0.6) -> bool:
    """Busy threads that together use about one core: they take turns on a GIL (False on NaN)."""
    return util >= min_util and 0.5 <= cores <= 1.15


#: The busy share above which a child's threads count as busy. Lower than in
#: this process: a child's dispatcher needs its GIL to hand each job over, so
#: GIL-bound threads there also wait for jobs, outside their fetch (measured
#: 0.50-0.62 with two threads of pure Python in one child on 2 cores).
_CHILD_MIN_UTIL = 0.4

#: The busy share from which a child's thread counts as one of its busy threads.
_CHILD_BUSY_THREAD = 0.25


class LoaderStats:
    """Per-iterator statistics: what was delivered and where time went."""

    def __init__(self) -> None:
        self._counters: list[WorkerCounters] = []
        self._num_workers = 0
        self._workers_here = True
        #: Workers in child processes (worker_processes): their counters per process, for the GIL check.
        self._processes: list[list[Any]] = []
        self._baseline = (0.0, 0.0, 0.0)
        self._generation = 0
        self._ended: float | None = None
        # new_epoch/ended (the consumer) against snapshot (any thread): a
        # snapshot sees one epoch's start, baseline and end, never a mix.
        self._epoch_lock = threading.Lock()
        renew_lock_after_fork(self, "_epoch_lock")
        self.gil_warned = False
        # The cores this process may use: with a narrower CPU affinity, idle
        # cores elsewhere on the machine are no use to it.
        machine = os.cpu_count() or 1
        cpus = usable_cpus()
        self._cpus = cpus if cpus is not None and len(cpus) < machine else None
        self._cores = len(cpus) if cpus else machine
        self.new_epoch()

    def __getstate__(self) -> dict[str, Any]:
        # A loader is pickled and copied with its last stats (Lightning and
        # Accelerate copy loaders): the lock is not state, a copy gets its own.
        state = dict(vars(self))
        del state["_epoch_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state)
        self._epoch_lock = threading.Lock()
        renew_lock_after_fork(self, "_epoch_lock")

    def bind(self, counters: list[WorkerCounters], num_workers: int) -> None:
        self._counters = counters
        self._num_workers = num_workers
        # Workers in child processes (worker_processes) cost this process no
        # CPU: its CPU time says nothing about their GIL.
        self._workers_here = all(getattr(c, "in_this_process", True) for c in counters)
        groups: dict[int, list[Any]] = {}
        if not self._workers_here:
            for c in counters:
                groups.setdefault(c.process, []).append(c)
        self._processes = list(groups.values())
        self._gil_mark = (time.perf_counter(), self._gil_sample())  # the first window starts with these workers

    def new_epoch(self, generation: int = 0) -> None:
        """Start counting afresh (a persistent iterator's next epoch).

        Args:
            generation: the pool's generation for this epoch: the workers'
                samples are counted per generation (``WorkerCounters.fetched``).
        """
        with self._epoch_lock:
            self.batches = 0
            self.items = 0
            self.wait_s = 0.0
            self._generation = generation
            self._ended = None
            self.started = time.perf_counter()
            self._baseline = self._worker_totals()
        self._gil_mark = (self.started, self._gil_sample())

    def ended(self) -> None:
        """The epoch is over (StopIteration, or its iterator stopped): its clock stops."""
        with self._epoch_lock:
            if self._ended is None:
                self._ended = time.perf_counter()

    def delivered(self, items: int) -> None:
        self.batches += 1
        self.items += items
        if self.batches & 15 == 0:  # the clock is read every 16 batches: this runs per batch
            now = time.perf_counter()
            if now - self._gil_mark[0] >= GIL_CHECK_INTERVAL_S:
                self._check_gil(now)

    def _gil_sample(self) -> tuple[float, float, float, tuple[float, float] | None,
                                   list[tuple[tuple[float, ...], float]]]:
        fetch = sum(c.fetch_s for c in self._counters)
        # Per child process: each of its workers' fetch time, and its CPU time (on its first worker's row).
        children = [(tuple(c.fetch_s for c in group), group[0].process_cpu_s) for group in self._processes]
        return fetch, process_cpu_seconds(), self.wait_s, system_cpu_seconds(self._cpus), children

    def _check_gil(self, now: float) -> None:
        """Warn once when the loader is the bottleneck and its busy workers share one core.

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
        idle. Nothing is said while the training loop rarely waits for data,
        nor on a free-threaded Python running without the GIL. Workers in
        ``worker_processes`` children cost this process no CPU: each child's
        dispatcher samples its own CPU time into the shared counters, and a
        child whose threads (two or more) are busy on about one core is
        GIL-bound the same way (one is enough for the warning, which then
        advises fewer threads per process).
        """
        then, (fetch0, cpu0, wait0, sys0, children0) = self._gil_mark
        fetch1, cpu1, wait1, sys1, children1 = sample = self._gil_sample()
        self._gil_mark = (now, sample)
        window = now - then
        if self.gil_warned or self._num_workers < 2 or self._cores < 2 or window <= 0 or not gil_enabled():
            return
        if (wait1 - wait0) / window < 0.25:  # the training loop rarely waits: the loader is not the bottleneck
            return
        if self._workers_here:
            util = (fetch1 - fetch0) / (window * self._num_workers)
            cores = (cpu1 - cpu0) / window
            if not _gil_bound(util, cores):
                return
            template, fields = GIL_WARNING, dict(workers=self._num_workers)
        else:
            # Each child's threads share that child's GIL; this process's CPU
            # time shows none of their work. One GIL-bound child is enough.
            bound = []
            for group, (f0, c0), (f1, c1) in zip(self._processes, children0, children1):
                shares = [(b - a) / window for a, b in zip(f0, f1)]
                util, cores = sum(shares) / len(group), (c1 - c0) / window
                # Two threads or more must have been busy: one busy thread on one
                # core is no sign of the GIL, whatever the others do (idle, waiting).
                busy = sum(share >= _CHILD_BUSY_THREAD for share in shares)
                if busy >= 2 and _gil_bound(util, cores, _CHILD_MIN_UTIL):
                    bound.append((util, cores, len(group)))
            if not bound:
                return
            util, cores = min(b[0] for b in bound), max(b[1] for b in bound)
            template = GIL_WARNING_PROCESSES
            fields = dict(workers=self._num_workers, processes=len(self._processes), procs=len(bound),
                          threads=max(b[2] for b in bound))
        free_text = ""
        if sys0 is not None and sys1 is not None and sys1[1] > sys0[1]:
            free = self._cores - (sys1[0] - sys0[0]) / (sys1[1] - sys0[1])
            if free < FREE_CORE_THRESHOLD:
                return  # the machine is full: the threads wait for a core, not for the GIL
            where = "machine's" if self._cpus is None else "usable"
            free_text = f" and {free:.1f} of the {where} {self._cores} cores stood idle"
        self.gil_warned = True
        warnings.warn(
            template.format(util=min(util, 1.0), window=window, cores=cores, free=free_text, **fields),
            RuntimeWarning,
            stacklevel=_caller_stacklevel(),
        )

    def waited(self, seconds: float) -> None:
        self.wait_s += seconds

    def _worker_totals(self) -> tuple[float, float, float]:
        fetch = sum(c.fetch_s for c in self._counters)
        collate = sum(c.collate_s for c in self._counters)
        pin = sum(c.pin_s for c in self._counters)
        return fetch, collate, pin

    def snapshot(self) -> dict[str, Any]:
        """A plain dict of the counters since this epoch started.

        Returns:
            ``batches``, ``items`` (delivered to the consumer), ``elapsed_s``
            (it stops at the epoch's end, or when the iterator is dropped
            or shut down; a persistent iterator left by ``break`` runs on
            until its next epoch), ``wait_s`` (consumer
            blocked waiting for data), ``fetch_s``,
            ``collate_s``, ``pin_s`` (summed over workers), ``items_fetched``,
            ``worker_utilization`` (busy time / (elapsed × workers), 0..1) and
            ``items_per_s``.
        """
        with self._epoch_lock:  # one epoch's fields (see new_epoch); totals only grow past its baseline
            end = time.perf_counter() if self._ended is None else self._ended
            elapsed = max(end - self.started, 1e-9)
            fetch, collate, pin = (now - base for now, base in zip(self._worker_totals(), self._baseline))
            fetched = sum(c.epoch_items for c in self._counters if c.epoch == self._generation)
            batches, items, wait_s = self.batches, self.items, self.wait_s
        busy = fetch + collate + pin
        util = busy / (elapsed * self._num_workers) if self._num_workers else 0.0
        return {
            "batches": batches,
            "items": items,
            "elapsed_s": elapsed,
            "wait_s": wait_s,
            "fetch_s": fetch,
            "collate_s": collate,
            "pin_s": pin,
            "items_fetched": fetched,
            "worker_utilization": min(util, 1.0),
            "items_per_s": items / elapsed,
        }

    def __repr__(self) -> str:
        s = self.snapshot()
        return (
            f"LoaderStats(batches={s['batches']}, items={s['items']}, items/s={s['items_per_s']:.0f}, "
            f"wait={s['wait_s']:.3f}s, fetch={s['fetch_s']:.3f}s, collate={s['collate_s']:.3f}s, "
            f"pin={s['pin_s']:.3f}s, utilization={s['worker_utilization']:.0%})"
        )
