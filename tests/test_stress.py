"""Stress: many loaders and consumer threads at once, with the GIL switching threads constantly.

No correctness may depend on the GIL. With ``sys.setswitchinterval`` tiny, a
GIL build switches threads every few bytecodes, so races in the engine's
bookkeeping, the buffer pools, the stats counters, the worker info and the
RNG routing get their chance; on a free-threaded build the threads run truly
in parallel. Every loader must still give DataLoader's batches (per-worker
randomness included) and leave no thread behind.
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest
import torch
from helpers import to_list
from torch.utils.data import DataLoader, Dataset, IterableDataset

from threadloader import Frame, ThreadDataLoader, frame_collate


class RandomSamples(Dataset):
    """Draws from the global RNG APIs, as random transforms do."""

    def __len__(self) -> int:
        return 48

    def __getitem__(self, i: int):
        import random

        return i, torch.rand(2), random.random(), float(np.random.rand())


class FrameSamples(Dataset):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int):
        return Frame(np.full((6, 5, 3), i, np.uint8)), i


class Stream(IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        wid, n = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(wid, 30, n))


CASES = {
    "random map": lambda cls: cls(RandomSamples(), batch_size=4, num_workers=3, shuffle=True,
                                  generator=torch.Generator().manual_seed(7)),
    "frames": lambda cls: cls(FrameSamples(), batch_size=5, num_workers=2, collate_fn=frame_collate),
    "iterable": lambda cls: cls(Stream(), batch_size=4, num_workers=3),
    "unbatched persistent": lambda cls: cls(RandomSamples(), batch_size=None, num_workers=2,
                                            persistent_workers=True, generator=torch.Generator().manual_seed(3)),
}


@pytest.fixture
def tiny_switch_interval():
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


#: Epochs each consumer reads from one loader (persistent workers serve both).
EPOCHS = {"random map": 1, "frames": 1, "iterable": 1, "unbatched persistent": 2}


def _epochs(loader, n: int) -> list:
    return [to_list(loader) for _ in range(n)]


def test_concurrent_loaders_give_dataloaders_batches(tiny_switch_interval) -> None:
    # The oracle runs first, on this thread (DataLoader forks its workers).
    expected = {name: _epochs(make(DataLoader), EPOCHS[name]) for name, make in CASES.items()}
    results: dict[tuple[str, int], list] = {}
    errors: list[BaseException] = []

    def consume(name: str, k: int) -> None:
        try:
            results[(name, k)] = _epochs(CASES[name](ThreadDataLoader), EPOCHS[name])
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=consume, args=(name, k)) for name in CASES for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a consumer hung"
    assert not errors, errors[0]
    assert len(results) == len(threads)
    for (name, _), got in results.items():
        assert got == expected[name], name
