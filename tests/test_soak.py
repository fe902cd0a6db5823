"""Soak: thousands of batches with flat memory, bounded in-flight work and no thread growth.

Kept short for CI (a few seconds in all); ``examples/soak.py`` is the long
version. Nothing here asserts speed.
"""

from __future__ import annotations

import gc
import importlib.util
import threading
import time
import types
import weakref
from pathlib import Path
from typing import Iterator

import pytest
import torch
from torch.utils.data import BatchSampler, Dataset, Sampler, SequentialSampler

from threadloader import ThreadDataLoader

# 3 worker threads on a 2-core CI machine: torch's "suggested max workers" warning is expected.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

MB = 1 << 20


class Tracked(Dataset):
    """Small float tensors; counts fetches running at once and fetches completed.

    Every ``slow_every``-th item sleeps briefly, so worker threads overlap and
    the concurrency counters are exercised, not trivially 1.
    """

    def __init__(self, n: int, floats: int = 16, slow_every: int = 0) -> None:
        self.n, self.floats, self.slow_every = n, floats, slow_every
        self.lock = threading.Lock()
        # One counter object for all workers: each worker thread has its own
        # shallow copy of the dataset, which shares this object.
        self.counts = types.SimpleNamespace(active=0, max_active=0, fetched=0)

    max_active = property(lambda self: self.counts.max_active)
    fetched = property(lambda self: self.counts.fetched)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        counts = self.counts
        with self.lock:
            counts.active += 1
            counts.max_active = max(counts.max_active, counts.active)
        try:
            if self.slow_every and i % self.slow_every == 0:
                time.sleep(0.0005)
            return torch.full((self.floats,), float(i))
        finally:
            with self.lock:
                counts.active -= 1
                counts.fetched += 1


class CountingBatchSampler(Sampler[list[int]]):
    """A batch sampler that counts the batches the loader has drawn from it."""

    def __init__(self, sampler: Sampler[int], batch_size: int) -> None:
        self.inner = BatchSampler(sampler, batch_size, drop_last=False)
        self.lock = threading.Lock()  # the engine draws on the consumer thread; be safe anyway
        self.drawn = 0

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.inner:
            with self.lock:
                self.drawn += 1
            yield batch

    def __len__(self) -> int:
        return len(self.inner)


def rss() -> int:
    """Resident memory after a full collection (so garbage awaiting collection is not counted)."""
    psutil = pytest.importorskip("psutil")
    gc.collect()
    return psutil.Process().memory_info().rss


def loader_threads() -> int:
    """Live worker threads of any ThreadDataLoader (conftest guarantees none leak in from earlier tests)."""
    return sum(t.name.startswith("threadloader-") for t in threading.enumerate())


def wait_for_loader_threads(target: int, timeout: float = 5.0) -> int:
    """Poll until at most ``target`` loader threads are alive (threads may still be joining)."""
    deadline = time.monotonic() + timeout
    count = loader_threads()
    while count > target and time.monotonic() < deadline:
        gc.collect()  # an iterator kept alive only by a cycle stops its threads when collected (slow: ~0.1 s)
        time.sleep(0.01)
        count = loader_threads()
    return count


@pytest.mark.parametrize("persistent", [True, False])
def test_rss_is_flat_after_warm_up(persistent: bool) -> None:
    """6000 batches over 6 epochs, with a checkpoint every 250 batches, as a training loop does.

    Each batch is 16 KiB: retaining batches (or anything per batch) leaks
    tens of MB over the measured 5000 batches, far above the 20 MB bound,
    while allocator noise stays well below it. RSS is sampled every 1000
    batches (each sample runs a full ``gc.collect()``, ~0.1 s with torch loaded).
    """
    batch_size, per_epoch, epochs = 8, 1000, 6
    loader = ThreadDataLoader(Tracked(batch_size * per_epoch, floats=512), batch_size=batch_size, shuffle=True,
                              num_workers=2, persistent_workers=persistent)
    samples: list[tuple[int, int]] = []
    seen = 0
    for _ in range(epochs):
        for _batch in loader:
            seen += 1
            if seen % 250 == 0:
                loader.state_dict()  # checkpoints must not accumulate anything either
            if seen % 1000 == 0:
                samples.append((seen, rss()))
    assert seen == per_epoch * epochs
    warm = [mem for n, mem in samples if n >= per_epoch]  # after the first epoch
    growth = max(warm) - warm[0]
    trace = ", ".join(f"{n}: {mem / MB:.1f}" for n, mem in samples)
    assert growth < 20 * MB, f"RSS grew {growth / MB:.1f} MB after warm-up (batches: MB) {trace}"


@pytest.mark.parametrize("persistent", [True, False])
def test_delivered_batches_are_not_retained(persistent: bool) -> None:
    """Once the consumer drops a batch, nothing in the loader may keep it (or its samples) alive.

    DataLoader's workers ``del`` their last batch for this reason: an idle
    persistent worker would otherwise pin a (possibly large, pinned) batch
    until the next epoch.
    """
    loader = ThreadDataLoader(Tracked(64, floats=8), batch_size=4, num_workers=2, persistent_workers=persistent)
    alive: list[list[int]] = []
    for _ in range(2):
        probes = [weakref.ref(batch) for batch in loader]
        deadline = time.monotonic() + 1.0
        while any(p() is not None for p in probes) and time.monotonic() < deadline:
            time.sleep(0.01)  # a worker may still be between posting and its next wait
        alive.append([i for i, p in enumerate(probes) if p() is not None])
    del loader  # stop persistent threads before asserting (a failure's traceback would keep them)
    assert alive == [[], []], f"batches (per epoch) still alive after the epoch, of {len(probes)}: {alive}"


@pytest.mark.parametrize(
    ("num_workers", "prefetch_factor", "in_order"),
    [(2, 2, True), (3, 1, True), (2, 4, False), (3, 2, False)],
)
def test_in_flight_work_is_bounded_by_prefetch_factor_times_workers(num_workers: int, prefetch_factor: int,
                                                                    in_order: bool) -> None:
    """DataLoader's contract: at most ``prefetch_factor * num_workers`` tasks outstanding.

    A task counts as outstanding from the moment the loader draws its indices
    from the batch sampler until the consumer has it. Measured at every
    hand-over, when the loader has just refilled its pipeline.
    """
    batch_size, n_batches = 4, 1500
    bound = prefetch_factor * num_workers
    dataset = Tracked(batch_size * n_batches, slow_every=37)
    batch_sampler = CountingBatchSampler(SequentialSampler(dataset), batch_size)
    loader = ThreadDataLoader(dataset, batch_sampler=batch_sampler, num_workers=num_workers,
                              prefetch_factor=prefetch_factor, in_order=in_order)
    consumed = consumed_items = 0
    max_tasks = max_items_ahead = 0
    for batch in loader:
        consumed += 1
        consumed_items += len(batch)
        max_tasks = max(max_tasks, batch_sampler.drawn - consumed)
        # Samples fetched but not yet delivered all belong to outstanding tasks.
        max_items_ahead = max(max_items_ahead, dataset.fetched - consumed_items)
    assert consumed == batch_sampler.drawn == n_batches
    assert max_tasks <= bound, f"{max_tasks} tasks outstanding, DataLoader allows {bound}"
    assert max_tasks == bound, "the prefetch pipeline was never full: the bound was not exercised"
    assert max_items_ahead <= bound * batch_size
    assert 1 <= dataset.max_active <= num_workers, "more concurrent fetches than worker threads"


def test_no_thread_growth_across_epochs_and_breaks() -> None:
    """Persistent and non-persistent loaders, full epochs and ``break``s: threads never accumulate.

    ``threading.active_count()`` may only shrink relative to the start (some
    unrelated thread may end meanwhile); the loader's own threads are counted
    exactly by name.
    """
    num_workers = 3
    baseline = threading.active_count()
    dataset = Tracked(400)

    persistent = ThreadDataLoader(dataset, batch_size=4, shuffle=True, num_workers=num_workers,
                                  persistent_workers=True)
    for epoch in range(8):
        for k, _ in enumerate(persistent):
            assert threading.active_count() <= baseline + num_workers
            if epoch % 2 and k == 10 * epoch:
                break  # abandon the epoch mid-way; the next iter() reuses the threads
        assert loader_threads() == num_workers, f"epoch {epoch}: persistent workers must be reused, not added"
    iter(persistent)  # an epoch started and abandoned before its first batch
    assert loader_threads() == num_workers
    del persistent
    assert wait_for_loader_threads(0) == 0, "persistent workers outlived their loader"

    loader = ThreadDataLoader(dataset, batch_size=4, shuffle=True, num_workers=num_workers)
    for epoch in range(8):
        it = iter(loader)
        for k, _ in enumerate(it):
            assert threading.active_count() <= baseline + num_workers
            if epoch % 2 and k == 10 * epoch:
                break
        del it  # a broken-off (or finished) iterator must stop its threads once dropped
        assert wait_for_loader_threads(0) == 0, f"epoch {epoch}"
    assert threading.active_count() <= baseline


def _load_soak_example():
    path = Path(__file__).resolve().parents[1] / "examples" / "soak.py"
    spec = importlib.util.spec_from_file_location("example_soak", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_soak_example_smoke(capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("psutil")
    rows = _load_soak_example().main(["--smoke", "--workers", "2", "--prefetch-factor", "3"])
    assert rows and rows[-1]["batches"] == sum(1 for _ in rows) * rows[0]["batches"]
    assert all(0 < r["max_in_flight"] <= 3 * 2 for r in rows)
    assert all(r["batches/s"] > 0 and r["rss_mb"] > 0 for r in rows)
    assert "batches/s" in capsys.readouterr().out
