"""One rank of the distributed tests (started by torchrun from tests/test_distributed.py).

Two phases, one torchrun launch each:

* ``run``: for every configuration in :data:`CONFIGS`, iterate a
  ``ThreadDataLoader`` with a ``DistributedSampler`` for several epochs
  (``set_epoch`` before each), iterate ``torch.utils.data.DataLoader`` with an
  identical sampler as the oracle, and run the same loop again but stop after
  a few batches of epoch :data:`STOP_EPOCH`, saving ``loader.state_dict()`` to
  a per-rank file (a preempted job).
  The ``run`` launch also serves a DataPipe graph (:func:`datapipe_runs`)
  from ranks whose global RNGs differ.
* ``resume``: a fresh process builds new loaders with the same arguments,
  loads each rank's checkpoint and iterates the rest of the interrupted epoch
  and the later epochs.

Each rank writes ``<phase>_rank<r>.json`` into ``--out``; the test process
reads and checks them. The ranks also all-reduce their sample counts over
gloo, so collectives are exercised while the loader threads run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torch.utils.data.datapipes.iter import IterableWrapper

from threadloader import ThreadDataLoader

EPOCHS = 3
STOP_EPOCH = 1
SEED = 7

#: name -> (dataset size, batch size, sampler drop_last, loader drop_last, persistent_workers).
#: 24 divides by the world size (2); 23 does not, so DistributedSampler pads
#: (or, with drop_last, truncates) the shuffled order.
CONFIGS: dict[str, tuple[int, int, bool, bool, bool]] = {
    "even": (24, 4, False, False, False),
    "padded": (23, 3, False, False, True),
    "truncated": (23, 3, True, True, False),
}


class IndexTensors(Dataset):
    """Sample ``i`` is ``(i, tensor([i, -i]))``: the index and a small tensor to collate."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor]:
        return i, torch.tensor([i, -i], dtype=torch.int64)


def as_lists(batch: Any) -> list:
    """A collated ``(indices, tensors)`` batch as plain lists (JSON, exact comparison)."""
    idx, tensors = batch
    return [idx.tolist(), tensors.tolist()]


def make_loader(name: str, rank: int, world: int, cls: type = ThreadDataLoader) -> DataLoader:
    n, batch_size, sampler_drop_last, loader_drop_last, persistent = CONFIGS[name]
    ds = IndexTensors(n)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=SEED,
                                 drop_last=sampler_drop_last)
    if cls is ThreadDataLoader:
        return ThreadDataLoader(ds, batch_size=batch_size, sampler=sampler, num_workers=2,
                                drop_last=loader_drop_last, persistent_workers=persistent)
    # The oracle: torch's own loader, in-process (the batches do not depend on
    # its worker count for a map-style dataset).
    return DataLoader(ds, batch_size=batch_size, sampler=sampler, num_workers=0, drop_last=loader_drop_last)


def epochs_of(loader: DataLoader, first: int = 0) -> list[list]:
    """Batches of epochs ``first..EPOCHS-1``, calling ``set_epoch`` before each."""
    out = []
    for e in range(first, EPOCHS):
        loader.sampler.set_epoch(e)
        out.append([as_lists(b) for b in loader])
    return out


def stop_batch(name: str, rank: int) -> int:
    """Where rank ``rank`` is "preempted" in epoch STOP_EPOCH: differs per rank and config, always mid-epoch.

    Every configuration has at least 3 batches per rank and epoch.
    """
    return 1 + (rank + list(CONFIGS).index(name)) % 2


def run_phase(out: Path, rank: int, world: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name in CONFIGS:
        thread = epochs_of(make_loader(name, rank, world))
        oracle = epochs_of(make_loader(name, rank, world, cls=DataLoader))
        # The same loop, preempted after k batches of STOP_EPOCH.
        loader = make_loader(name, rank, world)
        partial: list[list] = []
        for e in range(STOP_EPOCH + 1):
            loader.sampler.set_epoch(e)
            it = iter(loader)
            if e < STOP_EPOCH:
                partial.append([as_lists(b) for b in it])
                continue
            partial.append([as_lists(next(it)) for _ in range(stop_batch(name, rank))])
            torch.save({"loader": loader.state_dict(), "epoch": e}, out / f"ckpt_{name}_rank{rank}.pt")
            del it  # stop its threads, as a preempted process would
        result[name] = {"thread": thread, "oracle": oracle, "partial": partial}
    return result


def resume_phase(out: Path, rank: int, world: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    torch.manual_seed(1234 + rank)  # a new process: the global RNG is anywhere
    for name in CONFIGS:
        ckpt = torch.load(out / f"ckpt_{name}_rank{rank}.pt", weights_only=True)
        loader = make_loader(name, rank, world)
        loader.load_state_dict(ckpt["loader"])
        # The rest of the interrupted epoch, then the later ones.
        result[name] = {"resumed": epochs_of(loader, first=ckpt["epoch"])}
    return result


#: The DataPipe runs: dataset size, batch size.
DATAPIPE_N, DATAPIPE_BATCH = 30, 3


def datapipe_runs(rank: int) -> dict[str, list]:
    """A shuffled, sharded DataPipe graph served by both loaders, from a global RNG that differs per rank.

    DataLoader shuffles alike on every rank all the same (rank 0's seed is
    broadcast), then each rank keeps its shard. Per ``persistent_workers``:
    ``thread`` and ``oracle`` (torch's DataLoader, worker processes), EPOCHS
    epochs each; ``first`` and ``resumed``: a ThreadDataLoader checkpointed
    between its first and second epoch and resumed in a new loader, its RNG
    elsewhere in between.
    """
    def make(cls: type, persistent: bool) -> DataLoader:
        pipe = IterableWrapper(range(DATAPIPE_N)).shuffle().sharding_filter()
        # The oracle's worker processes come from a forkserver, not a fork of
        # this process: before 3.11.10, CPython's child can deadlock in its
        # after-fork clean-up when a native thread is entering Python at the
        # fork (CPython gh-112275; see
        # tools/fork_race.py). Same batches.
        context = {"multiprocessing_context": "forkserver"} if cls is DataLoader else {}
        return cls(pipe, batch_size=DATAPIPE_BATCH, num_workers=2, persistent_workers=persistent, **context)

    def epochs(loader: DataLoader, n: int) -> list[list[list[int]]]:
        return [[b.tolist() for b in loader] for _ in range(n)]

    out: dict[str, list] = {}
    for persistent in (False, True):
        runs = {}
        for name, cls in (("thread", ThreadDataLoader), ("oracle", DataLoader)):
            torch.manual_seed(100 + rank)  # as seed_everything(seed + rank) leaves it
            runs[name] = epochs(make(cls, persistent), EPOCHS)
        torch.manual_seed(100 + rank)
        loader = make(ThreadDataLoader, persistent)
        runs["first"] = epochs(loader, 1)
        state = loader.state_dict()
        del loader
        torch.manual_seed(5000 + rank)
        resumed = make(ThreadDataLoader, persistent)
        resumed.load_state_dict(state)
        runs["resumed"] = epochs(resumed, EPOCHS - 1)
        out[f"persistent={persistent}"] = runs
    return out


def count_samples(result: dict[str, Any]) -> int:
    return sum(len(b[0]) for cfg in result.values() for run in cfg.values() for ep in run for b in ep)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phase", choices=["run", "resume"])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    # The oracle's forkserver imports torch once: its workers then start in
    # a fraction of a second instead of importing torch each.
    multiprocessing.set_forkserver_preload(["torch", "threadloader"])
    dist.init_process_group("gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        assert int(os.environ["LOCAL_RANK"]) == rank  # one node
        result = run_phase(args.out, rank, world) if args.phase == "run" else resume_phase(args.out, rank, world)
        # A collective after the loaders ran (and while persistent workers may
        # still exist): gloo and the loader threads must coexist.
        total = torch.tensor([count_samples(result)], dtype=torch.int64)
        dist.all_reduce(total)
        payload = {"rank": rank, "world": world, "all_reduced_samples": int(total), "configs": result}
        if args.phase == "run":
            payload["datapipe"] = datapipe_runs(rank)
        tmp = args.out / f".{args.phase}_rank{rank}.json.tmp"
        tmp.write_text(json.dumps(payload))
        tmp.replace(args.out / f"{args.phase}_rank{rank}.json")  # the test never reads a half-written file
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
