"""Soak run: many small batches, reporting throughput, resident memory and in-flight work over time.

A long-running job must not creep: resident memory should stay flat after
warm-up, the loader should never hold more than ``prefetch_factor *
num_workers`` batches' worth of work (DataLoader's bound), and worker threads
should not accumulate across epochs. This script iterates a map-style dataset
of small tensors for ``--batches`` batches (in epochs of ``--epoch-batches``,
with persistent workers and a ``state_dict()`` checkpoint every report, as a
training loop would) and prints one row every ``--report-every`` batches.

Columns: batches so far, batches/s over the last interval, RSS (MB), RSS
growth since the first report, the most batches in flight seen in the
interval (drawn from the sampler but not yet delivered), the most samples
being fetched at once, and live Python threads.

Usage::

    python examples/soak.py --batches 1000000 --workers 4 --report-every 50000
    python examples/soak.py --smoke        # seconds, for tests
"""

from __future__ import annotations

import argparse
import gc
import threading
import time
from typing import Any, Iterator

import torch
from torch.utils.data import BatchSampler, Dataset, RandomSampler, Sampler

from threadloader import ThreadDataLoader


def _psutil() -> Any:
    """psutil, imported only for a run (``--help`` works without it)."""
    try:
        import psutil
    except ImportError:
        raise SystemExit("examples/soak.py reads memory through psutil: pip install psutil") from None
    return psutil


class SmallTensors(Dataset):
    """Sample ``i`` is a float tensor of ``floats`` values; counts fetches running at once."""

    def __init__(self, n: int, floats: int) -> None:
        self.n, self.floats = n, floats
        self.lock = threading.Lock()
        # Shared by the workers' copies of the dataset (each worker thread has
        # its own shallow copy, as each worker process has its own copy).
        self.counts = {"active": 0, "max_active": 0}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        counts = self.counts
        with self.lock:
            counts["active"] += 1
            counts["max_active"] = max(counts["max_active"], counts["active"])
        try:
            return torch.full((self.floats,), float(i))
        finally:
            with self.lock:
                counts["active"] -= 1

    def take_max_active(self) -> int:
        """The most concurrent fetches since the last call."""
        counts = self.counts
        with self.lock:
            value, counts["max_active"] = counts["max_active"], counts["active"]
        return value


class CountingBatchSampler(Sampler[list[int]]):
    """Shuffled batches, counting how many the loader has drawn."""

    def __init__(self, n: int, batch_size: int) -> None:
        self.inner = BatchSampler(RandomSampler(range(n)), batch_size, drop_last=True)
        self.drawn = 0

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.inner:
            self.drawn += 1  # the loader draws on its consumer thread only
            yield batch

    def __len__(self) -> int:
        return len(self.inner)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Run the soak and print a row per report.

    Args:
        argv: command-line arguments (see ``--help``).

    Returns:
        One dict per report: ``batches``, ``epoch``, ``batches/s``, ``rss_mb``,
        ``rss_growth_mb``, ``max_in_flight``, ``max_concurrent_fetches``,
        ``threads``.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200_000, help="batches in total")
    parser.add_argument("--epoch-batches", type=int, default=20_000, help="batches per epoch")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--floats", type=int, default=256, help="values per sample")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--prefetch-factor", type=int, default=2)
    parser.add_argument("--report-every", type=int, default=10_000)
    parser.add_argument("--unordered", action="store_true", help="in_order=False")
    parser.add_argument("--smoke", action="store_true", help="a few hundred batches, for tests")
    args = parser.parse_args(argv)
    if args.smoke:
        args.batches, args.epoch_batches, args.report_every, args.floats = 600, 250, 200, 64

    dataset = SmallTensors(args.epoch_batches * args.batch_size, args.floats)
    batch_sampler = CountingBatchSampler(len(dataset), args.batch_size)
    loader = ThreadDataLoader(dataset, batch_sampler=batch_sampler, num_workers=args.workers,
                              prefetch_factor=args.prefetch_factor, persistent_workers=True,
                              in_order=not args.unordered)
    proc = _psutil().Process()
    rows: list[dict[str, Any]] = []
    print(f"{'batches':>10} {'epoch':>5} {'batches/s':>10} {'rss MB':>8} {'growth':>7} "
          f"{'in flight':>9} {'fetching':>8} {'threads':>7}", flush=True)
    done = epoch = max_in_flight = 0
    first_rss: float | None = None
    t_last = time.perf_counter()
    while done < args.batches:
        for _batch in loader:
            done += 1
            # Drawn from the sampler, not yet delivered (each epoch's draws are all delivered).
            max_in_flight = max(max_in_flight, batch_sampler.drawn - done)
            if done % args.report_every == 0:
                loader.state_dict()  # a checkpoint per report, as training would take
                now = time.perf_counter()
                gc.collect()  # count live memory, not garbage waiting for collection
                rss_mb = proc.memory_info().rss / 2**20
                first_rss = rss_mb if first_rss is None else first_rss
                row = {
                    "batches": done,
                    "epoch": epoch,
                    "batches/s": args.report_every / max(now - t_last, 1e-9),
                    "rss_mb": rss_mb,
                    "rss_growth_mb": rss_mb - first_rss,
                    "max_in_flight": max_in_flight,
                    "max_concurrent_fetches": dataset.take_max_active(),
                    "threads": threading.active_count(),
                }
                rows.append(row)
                print(f"{done:>10} {epoch:>5} {row['batches/s']:>10.0f} {rss_mb:>8.1f} {row['rss_growth_mb']:>+7.1f} "
                      f"{max_in_flight:>9} {row['max_concurrent_fetches']:>8} {row['threads']:>7}", flush=True)
                max_in_flight = 0
                t_last = time.perf_counter()  # the report's own cost is not counted
            if done >= args.batches:
                break  # mid-epoch: the persistent iterator is abandoned, as at the end of training
        else:
            epoch += 1
    bound = args.prefetch_factor * args.workers
    print(f"max in flight {max(r['max_in_flight'] for r in rows) if rows else 0} (bound {bound}); "
          f"RSS growth {rows[-1]['rss_growth_mb'] if rows else 0.0:+.1f} MB", flush=True)
    return rows


if __name__ == "__main__":
    main()
