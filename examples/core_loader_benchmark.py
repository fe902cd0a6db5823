"""Loader overhead: DataLoader against ThreadDataLoader on a trivial dataset.

The dataset returns its index, so everything measured is the loader's own
cost: moving indices to workers and samples back. DataLoader pays for
inter-process queues and pickling on every item; threads hand objects over in
memory. Runs are interleaved (DataLoader, ThreadDataLoader, DataLoader, ...)
and each figure is the median of ``--repeats`` runs, so a noisy machine biases
both loaders alike; the ratios are what to read.

A third column, the hand-off floor, runs the same tasks through bare threads
and ``queue.SimpleQueue`` s, with no loader around them: DataLoader's pattern
(tasks dealt round-robin, ``prefetch_factor * workers`` in flight, results
released in order), each task just returning its indices. No thread-based
loader keeping that pattern beats it on the machine at hand; "of floor" says
how close ThreadDataLoader gets, and "floor x" is the floor over DataLoader:
the best speed-up any such loader could show here.

With several worker counts (``--workers 1,2,4,8,16,32``) it shows how the
engine alone scales: the dataset costs nothing, so any loss with more workers
is the loader's hand-offs and the consumer's per-batch work.

Usage::

    python examples/core_loader_benchmark.py                        # 2 workers
    python examples/core_loader_benchmark.py --workers 1,4,16,32    # engine scaling
    python examples/core_loader_benchmark.py --smoke                # seconds, for tests
"""

from __future__ import annotations

import argparse
import itertools
import queue
import statistics
import threading
import time
from typing import Any

from torch.utils.data import DataLoader, Dataset

from threadloader import ThreadDataLoader
from threadloader.bench import parse_workers


class IndexDataset(Dataset):
    """Returns its index: no work but the loader's."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def measure(cls: type, n: int, workers: int, batch_size: int | None) -> tuple[float, float]:
    """Items per second over one epoch (after the first batch) and time to first batch."""
    t0 = time.perf_counter()
    it = iter(cls(IndexDataset(n), batch_size=batch_size, num_workers=workers))
    next(it)
    first = time.perf_counter() - t0
    t1 = time.perf_counter()
    batches = sum(1 for _ in it)
    elapsed = time.perf_counter() - t1
    items = batches * (batch_size or 1)
    return items / elapsed, first


def handoff_floor(n: int, workers: int, batch_size: int | None, prefetch_factor: int = 2) -> float:
    """Items per second through bare worker threads and queues, in DataLoader's task pattern (see the docstring)."""
    per_task = batch_size or 1
    tasks = n // per_task
    jobs = [queue.SimpleQueue() for _ in range(workers)]
    results: queue.SimpleQueue = queue.SimpleQueue()

    def serve(q: queue.SimpleQueue) -> None:
        while (task := q.get()) is not None:
            results.put((task, task if batch_size is None else list(range(task * per_task, (task + 1) * per_task))))

    threads = [threading.Thread(target=serve, args=(q,), daemon=True) for q in jobs]
    for t in threads:
        t.start()
    deal = itertools.cycle(jobs)
    sent, stash = 0, {}
    for _ in range(min(tasks, prefetch_factor * workers)):
        next(deal).put(sent)
        sent += 1
    t0 = time.perf_counter()
    for received in range(tasks):
        while received not in stash:
            task, data = results.get()
            stash[task] = data
        del stash[received]
        if sent < tasks:
            next(deal).put(sent)
            sent += 1
    elapsed = time.perf_counter() - t0
    for q in jobs:
        q.put(None)
    for t in threads:
        t.join()
    return tasks * per_task / elapsed


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=parse_workers, default=[2],
                        help="comma-separated worker counts, e.g. 1,4,16,32 (default 2)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--items-unbatched", type=int, default=20_000)
    parser.add_argument("--items-batched", type=int, default=400_000)
    parser.add_argument("--smoke", action="store_true", help="tiny run for tests")
    args = parser.parse_args(argv)
    if args.smoke:
        args.repeats, args.items_unbatched, args.items_batched = 1, 400, 4_000

    configs = [("unbatched", None, args.items_unbatched), ("batch 64", 64, args.items_batched)]
    rows = []
    for workers in args.workers:
        for name, batch_size, n in configs:
            runs: dict[str, list[tuple[float, float]]] = {"DataLoader": [], "ThreadDataLoader": []}
            floors = []
            for _ in range(args.repeats):
                for cls in (DataLoader, ThreadDataLoader):
                    runs[cls.__name__].append(measure(cls, n, workers, batch_size))
                floors.append(handoff_floor(n, workers, batch_size))
            med = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v)) for k, v in runs.items()}
            rows.append({
                "config": name,
                "workers": workers,
                "dataloader_items_s": med["DataLoader"][0],
                "thread_items_s": med["ThreadDataLoader"][0],
                "speedup": med["ThreadDataLoader"][0] / med["DataLoader"][0],
                "floor_items_s": statistics.median(floors),
                "of_floor": med["ThreadDataLoader"][0] / statistics.median(floors),
                "floor_speedup": statistics.median(floors) / med["DataLoader"][0],
                "dataloader_first_ms": med["DataLoader"][1] * 1e3,
                "thread_first_ms": med["ThreadDataLoader"][1] * 1e3,
                "first_batch_ratio": med["ThreadDataLoader"][1] / med["DataLoader"][1],
            })

    print(f"{'config':<10} {'workers':>7} {'DataLoader it/s':>16} {'Thread it/s':>13} {'speedup':>8} "
          f"{'floor it/s':>12} {'of floor':>8} {'floor x':>8} {'DL first ms':>12} {'TL first ms':>12} "
          f"{'first ratio':>12}")
    for r in rows:
        print(f"{r['config']:<10} {r['workers']:>7} {r['dataloader_items_s']:>16,.0f} {r['thread_items_s']:>13,.0f} "
              f"{r['speedup']:>7.1f}x {r['floor_items_s']:>12,.0f} {r['of_floor']:>8.2f} {r['floor_speedup']:>7.1f}x "
              f"{r['dataloader_first_ms']:>12.1f} {r['thread_first_ms']:>12.1f} {r['first_batch_ratio']:>12.2f}")
    return rows


if __name__ == "__main__":
    main()
