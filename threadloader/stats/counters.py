"""Counters that tell a user where an iterator's time goes: :class:`WorkerCounters`, :class:`LoaderStats`.

Each worker thread writes only its own :class:`WorkerCounters`; the consumer
writes only :class:`LoaderStats`' own fields. Reading a snapshot while workers
run gives approximate (never torn per field) values, which is what a progress
report needs; no lock is taken on the hot path.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from .._platform.fork import renew_lock_after_fork
from .._platform.interpreter import gil_enabled
from . import cpu, gil
from .gil import GIL_CHECK_INTERVAL_S


def _running_for(since: float, now: float) -> float:
    """Seconds from ``since`` to ``now`` (``time.perf_counter()`` stamps); 0.0 when ``since`` is unset (0.0) or later."""
    return now - since if 0.0 < since <= now else 0.0


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
    #: ``time.perf_counter()`` when the fetch in progress began (0.0: none).
    #: Set to 0.0 before ``fetch_s`` grows: a reader may miss a fetch that
    #: just ended for a moment, never count it twice.
    fetch_since: float = 0.0

    def fetch_until(self, now: float) -> float:
        """Fetch seconds up to ``now`` (``time.perf_counter()``): those counted, and the fetch in progress.

        A task on a core-hungry thread may take longer than the window the GIL
        check reads; counting only finished fetches would show busy threads as idle.
        """
        done = self.fetch_s  # read before fetch_since (see fetch_since)
        return done + _running_for(self.fetch_since, now)

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


class LoaderStats:
    """Per-iterator statistics: what was delivered and where time went."""

    def __init__(self) -> None:
        self._counters: Sequence[Any] = []
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
        #: The loader's report of where its workers run, and why (:class:`~threadloader.engine.protocol.ModeReport`).
        self.mode_report: Any = None
        self._on_gil_bound: weakref.WeakMethod | None = None
        #: ``time.perf_counter()`` when the consumer's wait in progress began (0.0: not waiting).
        self._waiting_since = 0.0
        self._interval = GIL_CHECK_INTERVAL_S
        self._grouped: list[Any] = []
        # The cores this process may use: with a narrower CPU affinity, idle
        # cores elsewhere on the machine are no use to it.
        machine = os.cpu_count() or 1
        cpus = cpu.usable_cpus()
        self._cpus = cpus if cpus is not None and len(cpus) < machine else None
        self._cores = len(cpus) if cpus else machine
        self.new_epoch()

    def __getstate__(self) -> dict[str, Any]:
        # A loader is pickled and copied with its last stats (Lightning and
        # Accelerate copy loaders): the lock is not state, a copy gets its own.
        state = dict(vars(self))
        del state["_epoch_lock"]
        state["_on_gil_bound"] = None  # a weak reference to this process's pool
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state)
        self._epoch_lock = threading.Lock()
        renew_lock_after_fork(self, "_epoch_lock")

    def bind(self, counters: Sequence[Any], num_workers: int,
             on_gil_bound: Callable[[gil.GilBound], bool] | None = None) -> None:
        """Count the work of ``counters`` (the pool's, by worker id).

        Args:
            counters: the workers' counters. A pool that moves its workers
                replaces them in this same list; the GIL check follows.
            num_workers: the loader's workers.
            on_gil_bound: the pool's answer to GIL-bound workers (a bound
                method, held weakly): True when it acts on them, so no
                warning is given; None: warn.
        """
        self._counters = counters
        self._num_workers = num_workers
        self._on_gil_bound = None if on_gil_bound is None else weakref.WeakMethod(on_gil_bound)  # type: ignore[arg-type]
        self._interval = GIL_CHECK_INTERVAL_S if on_gil_bound is None else gil.ADAPT_CHECK_INTERVAL_S
        self._group()
        self._gil_mark = (time.perf_counter(), self._gil_sample())  # the first window starts with these workers

    def _group(self) -> None:
        """Group the counters by where their workers run (see :meth:`bind`)."""
        counters = self._counters
        # Workers in child processes (worker_processes) cost this process no
        # CPU: its CPU time says nothing about their GIL.
        self._workers_here = all(getattr(c, "in_this_process", True) for c in counters)
        groups: dict[int, list[Any]] = {}
        if not self._workers_here:
            for c in counters:
                groups.setdefault(c.process, []).append(c)
        self._processes = list(groups.values())
        self._grouped = list(counters)

    @property
    def mode(self) -> str:
        """Where the workers run and why, in one line (empty before workers ran)."""
        return self.mode_report.line() if self.mode_report is not None else ""

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
        # The clock is read every 16 batches (this runs per batch); every
        # batch where a pool may move its workers: it must decide early.
        if self.batches & 15 == 0 or self._on_gil_bound is not None:
            self._check_gil_if_due()

    def _check_gil_if_due(self) -> None:
        now = time.perf_counter()
        if now - self._gil_mark[0] >= self._interval:
            self._check_gil(now)

    def _gil_sample(self) -> gil.Sample:
        counters = self._counters
        now = time.perf_counter()
        fetch = sum(c.fetch_until(now) for c in counters)
        # Per child process: each of its workers' fetch time, and its CPU time (on its first worker's row).
        children = [(tuple(c.fetch_until(now) for c in group), group[0].process_cpu_s) for group in self._processes]
        wait = self.wait_s + _running_for(self._waiting_since, now)  # the wait in progress counts
        return gil.Sample(fetch, cpu.process_cpu_seconds(), wait, cpu.system_cpu_seconds(self._cpus), children,
                          sum(c.tasks for c in counters))

    def _check_gil(self, now: float) -> None:
        """Act once when the workers look GIL-bound over the window since the last check (:func:`.gil.verdict`).

        The pool may act on it (it moves its workers into processes);
        otherwise the user is warned.
        """
        if any(a is not b for a, b in zip(self._counters, self._grouped)):
            self._group()  # the pool moved its workers: a window starts with the new ones
            self._gil_mark = (now, self._gil_sample())
            return
        then, before = self._gil_mark
        sample = self._gil_sample()
        self._gil_mark = (now, sample)
        window = now - then
        if self.gil_warned or self._num_workers < 2 or self._cores < 2 or window <= 0 or not gil_enabled():
            return
        message = gil.verdict(before, sample, window, num_workers=self._num_workers, usable_cores=self._cores,
                              narrowed=self._cpus is not None, workers_here=self._workers_here,
                              group_sizes=[len(group) for group in self._processes])
        act = self._on_gil_bound() if self._on_gil_bound is not None else None
        cores = (sample.cpu - before.cpu) / window
        # Tasks still running count: each has cost CPU in the window (the first ones may take longer than it).
        tasks = sample.tasks - before.tasks + sum(1 for c in self._counters if c.fetch_since)
        if message is None:
            if act is not None and self._workers_here:
                # The pool may move its workers: the wider test (it never warns).
                why = gil.held_back(before, sample, window, num_workers=self._num_workers, usable_cores=self._cores)
                if why is not None and not act(gil.GilBound(why, window, cores, tasks)):
                    self._on_gil_bound = None  # declined: no more probes of the GIL
            return
        if act is not None and act(gil.GilBound(message, window, cores, tasks)):
            return
        self.gil_warned = True
        warnings.warn(message, RuntimeWarning, stacklevel=gil.caller_stacklevel())

    def waiting(self, since: float) -> None:
        """The consumer waits for data from ``since`` (``time.perf_counter()``) until :meth:`waited`."""
        self._waiting_since = since

    def waited(self, seconds: float) -> None:
        self.wait_s += seconds
        self._waiting_since = 0.0

    def look(self) -> None:
        """The consumer has waited a while with no result: run the GIL check if a window is due.

        For a pool that may move its workers (``bind``'s ``on_gil_bound``):
        it must decide early even when the first results take seconds.
        """
        if self._on_gil_bound is not None:
            self._check_gil_if_due()

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
            "mode": self.mode,
        }

    def __repr__(self) -> str:
        s = self.snapshot()
        return (
            f"LoaderStats(batches={s['batches']}, items={s['items']}, items/s={s['items_per_s']:.0f}, "
            f"wait={s['wait_s']:.3f}s, fetch={s['fetch_s']:.3f}s, collate={s['collate_s']:.3f}s, "
            f"pin={s['pin_s']:.3f}s, utilization={s['worker_utilization']:.0%}, mode={s['mode']!r})"
        )
