"""loader.stats(): counters, and the warning when the dataset holds the GIL."""

from __future__ import annotations

import os
import time
import warnings

import pytest
from torch.utils.data import Dataset

from threadloader import ThreadDataLoader
from threadloader.stats import GIL_CHECK_INTERVAL_S

from helpers import Slow


class PythonLoop(Dataset):
    """Pure-Python work: holds the GIL the whole time."""

    def __init__(self, n: int, work: int = 40_000) -> None:
        self.n, self.work = n, work

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        x = 0
        for k in range(self.work):
            x += k
        return i


def run_for(loader, seconds: float) -> list:
    """Iterate until ``seconds`` passed (enough windows for the GIL check)."""
    out, deadline = [], time.monotonic() + seconds
    for batch in loader:
        out.append(batch)
        if time.monotonic() > deadline:
            break
    return out


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="the GIL check needs 2 cores to compare with")
def test_warns_once_when_workers_are_gil_bound():
    loader = ThreadDataLoader(PythonLoop(100_000), batch_size=4, num_workers=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_for(loader, 3 * GIL_CHECK_INTERVAL_S + 0.5)
    gil = [w for w in caught if "holds the GIL" in str(w.message)]
    assert len(gil) == 1, [str(w.message) for w in caught]
    assert issubclass(gil[0].category, RuntimeWarning)
    assert "Release the GIL" in str(gil[0].message)
    assert loader.stats().gil_warned


def test_no_gil_warning_when_workers_wait_on_io():
    loader = ThreadDataLoader(Slow(10_000, 0.01), batch_size=2, num_workers=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_for(loader, 2 * GIL_CHECK_INTERVAL_S + 0.5)
    assert not [w for w in caught if "holds the GIL" in str(w.message)]


def test_snapshot_fields_and_repr():
    loader = ThreadDataLoader(Slow(12, 0.002), batch_size=3, num_workers=2)
    assert loader.stats() is None
    list(loader)
    snap = loader.stats().snapshot()
    assert set(snap) == {"batches", "items", "elapsed_s", "wait_s", "fetch_s", "collate_s", "pin_s",
                         "items_fetched", "worker_utilization", "items_per_s"}
    assert snap["batches"] == 4 and snap["items"] == 12
    assert snap["wait_s"] > 0 and snap["collate_s"] >= 0
    assert "LoaderStats(batches=4, items=12" in repr(loader.stats())


def test_stats_restart_each_persistent_epoch():
    loader = ThreadDataLoader(Slow(8, 0.001), batch_size=2, num_workers=2, persistent_workers=True)
    list(loader)
    list(loader)
    snap = loader.stats().snapshot()
    assert snap["batches"] == 4 and snap["items_fetched"] == 8
    del loader


def test_tqdm_total_is_the_number_of_batches():
    tqdm = pytest.importorskip("tqdm").tqdm
    loader = ThreadDataLoader(Slow(10, 0), batch_size=3, num_workers=2)
    bar = tqdm(loader, disable=False, file=open(os.devnull, "w"))
    n = sum(1 for _ in bar)
    assert bar.total == len(loader) == n == 4
