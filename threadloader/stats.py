"""Counters that tell a user where an iterator's time goes.

Each worker thread writes only its own :class:`WorkerCounters`; the consumer
writes only :class:`LoaderStats`' own fields. Reading a snapshot while workers
run gives approximate (never torn per field) values, which is what a progress
report needs; no lock is taken on the hot path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any


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

    def delivered(self, items: int) -> None:
        self.batches += 1
        self.items += items

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
