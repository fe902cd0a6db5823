"""Counters that tell a user where an iterator's time goes.

Each worker thread writes only its own :class:`WorkerCounters`; the consumer
writes only :class:`LoaderStats`' own fields. Reading a snapshot while workers
run gives approximate (never torn per field) values, which is what a progress
report needs; no lock is taken on the hot path.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass
from typing import Any

#: Seconds between checks of whether the workers are GIL-bound.
GIL_CHECK_INTERVAL_S = 1.0

GIL_WARNING = (
    "ThreadDataLoader: the {workers} worker threads were busy {util:.0%} of the last {window:.1f}s but used only "
    "{cores:.2f} CPU cores together while the training loop waited for data: the dataset's Python code most "
    "likely holds the GIL, so these threads take turns "
    "instead of running in parallel and more workers will not load faster. Release the GIL in the expensive "
    "step: do it in a library call that releases it (NumPy/torch operations, Pillow or "
    "threadloader.io.decode_image for images, zlib, file reads) instead of a Python loop."
)


@dataclass
class WorkerCounters:
    """Time and work of one worker thread (written by that thread only)."""

    fetch_s: float = 0.0
    collate_s: float = 0.0
    pin_s: float = 0.0
    items: int = 0
    tasks: int = 0
    busy: bool = False


class LoaderStats:
    """Per-iterator statistics: what was delivered and where time went."""

    def __init__(self) -> None:
        self._counters: list[WorkerCounters] = []
        self._num_workers = 0
        self._baseline = (0.0, 0.0, 0.0, 0)
        self.gil_warned = False
        self._cores = os.cpu_count() or 1
        self.new_epoch()

    def bind(self, counters: list[WorkerCounters], num_workers: int) -> None:
        self._counters = counters
        self._num_workers = num_workers

    def new_epoch(self) -> None:
        """Start counting afresh (a persistent iterator's next epoch)."""
        self.batches = 0
        self.items = 0
        self.wait_s = 0.0
        self.started = time.perf_counter()
        self._baseline = self._worker_totals()
        self._gil_mark = (self.started, self._gil_sample())

    def delivered(self, items: int) -> None:
        self.batches += 1
        self.items += items
        if self.batches & 15 == 0:  # the clock is read every 16 batches: this runs per batch
            now = time.perf_counter()
            if now - self._gil_mark[0] >= GIL_CHECK_INTERVAL_S:
                self._check_gil(now)

    def _gil_sample(self) -> tuple[float, float, float]:
        fetch = sum(c.fetch_s for c in self._counters)
        return fetch, time.process_time(), self.wait_s

    def _check_gil(self, now: float) -> None:
        """Warn once when the loader is the bottleneck and its busy workers share one core.

        Threads that run Python code take turns on the GIL: however many there
        are, together they use about one core, while each one looks busy
        (waiting for the GIL counts as busy). I/O-bound workers use little CPU,
        and code that releases the GIL -- or hands work to a library's own
        thread pool -- uses more than one core, so neither matches. The
        process's CPU time is used, so pools' threads count. Nothing is said
        while the training loop rarely waits for data.
        """
        then, (fetch0, cpu0, wait0) = self._gil_mark
        fetch1, cpu1, wait1 = sample = self._gil_sample()
        self._gil_mark = (now, sample)
        window = now - then
        if self.gil_warned or self._num_workers < 2 or self._cores < 2 or window <= 0:
            return
        util = (fetch1 - fetch0) / (window * self._num_workers)
        cores = (cpu1 - cpu0) / window
        waiting = (wait1 - wait0) / window
        if util >= 0.6 and waiting >= 0.25 and 0.5 <= cores <= 1.15:
            self.gil_warned = True
            warnings.warn(
                GIL_WARNING.format(workers=self._num_workers, util=min(util, 1.0), window=window, cores=cores),
                RuntimeWarning,
                stacklevel=4,
            )

    def waited(self, seconds: float) -> None:
        self.wait_s += seconds

    def _worker_totals(self) -> tuple[float, float, float, int]:
        fetch = sum(c.fetch_s for c in self._counters)
        collate = sum(c.collate_s for c in self._counters)
        pin = sum(c.pin_s for c in self._counters)
        items = sum(c.items for c in self._counters)
        return fetch, collate, pin, items

    def snapshot(self) -> dict[str, Any]:
        """A plain dict of the counters since this epoch started.

        Returns:
            ``batches``, ``items`` (delivered to the consumer), ``elapsed_s``,
            ``wait_s`` (consumer blocked waiting for data), ``fetch_s``,
            ``collate_s``, ``pin_s`` (summed over workers), ``items_fetched``,
            ``worker_utilization`` (busy time / (elapsed × workers), 0..1) and
            ``items_per_s``.
        """
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        fetch, collate, pin, fetched = (
            now - base for now, base in zip(self._worker_totals(), self._baseline)
        )
        busy = fetch + collate + pin
        util = busy / (elapsed * self._num_workers) if self._num_workers else 0.0
        return {
            "batches": self.batches,
            "items": self.items,
            "elapsed_s": elapsed,
            "wait_s": self.wait_s,
            "fetch_s": fetch,
            "collate_s": collate,
            "pin_s": pin,
            "items_fetched": fetched,
            "worker_utilization": min(util, 1.0),
            "items_per_s": self.items / elapsed,
        }

    def __repr__(self) -> str:
        s = self.snapshot()
        return (
            f"LoaderStats(batches={s['batches']}, items={s['items']}, items/s={s['items_per_s']:.0f}, "
            f"wait={s['wait_s']:.3f}s, fetch={s['fetch_s']:.3f}s, collate={s['collate_s']:.3f}s, "
            f"pin={s['pin_s']:.3f}s, utilization={s['worker_utilization']:.0%})"
        )
