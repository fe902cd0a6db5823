"""DDP training with ThreadDataLoader: DistributedSampler, set_epoch, checkpoint and exact resume.

Each process (rank) builds its own ``ThreadDataLoader`` over its shard
(``DistributedSampler``), calls ``sampler.set_epoch(epoch)`` before every epoch
(otherwise every epoch has the same order), and every ``--save-every`` steps
saves the model and optimizer (rank 0) and *its own* loader position
(``loader.state_dict()``, one file per rank: each rank is at a different place
in a different shard). After a preemption, the same command resumes: each rank
loads its loader state into a new loader and gets exactly the batches it had
not yet trained on, then the same later epochs as an uninterrupted run.

Launch
------
One node, 4 processes (e.g. 4 GPUs)::

    torchrun --nproc_per_node=4 examples/ddp_train.py --ckpt-dir /ckpt/run1

Two nodes, 4 processes each; run on every node, with its own ``--node_rank``
and the address of node 0 (reachable from the other node)::

    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=4 \\
        --master_addr=10.0.0.1 --master_port=29500 examples/ddp_train.py --ckpt-dir /shared/ckpt/run1
    torchrun --nnodes=2 --node_rank=1 --nproc_per_node=4 \\
        --master_addr=10.0.0.1 --master_port=29500 examples/ddp_train.py --ckpt-dir /shared/ckpt/run1

Smoke test (CPU, gloo, tiny model and data, seconds)::

    torchrun --nproc_per_node=2 --master_addr=127.0.0.1 --master_port=29500 examples/ddp_train.py --smoke
    python examples/ddp_train.py --smoke        # one process, no torchrun

What to set
-----------
- ``num_workers``: worker *threads* in this process. They share the process's
  cores with PyTorch's own intra-op threads, so start at about
  ``cores per node / processes per node`` (the default here) and lower it if
  the training step itself is CPU-bound.
- ``OMP_NUM_THREADS``: torchrun sets it to 1 when unset (with a warning). Set it
  explicitly; keep ``OMP_NUM_THREADS + num_workers`` near the cores each
  process owns, so loader threads and compute threads do not oversubscribe.
- ``pin_memory=True`` on GPUs (batches are pinned in the worker threads, and
  ``.to(device, non_blocking=True)`` overlaps the copy); off on CPU.
- ``persistent_workers=True``: keeps the threads across epochs (threads are
  cheap to start, but this also keeps the prefetch pipeline warm).
- ``sampler.set_epoch(epoch)`` before each epoch, on every rank; and on resume,
  before iterating the resumed loader, with the checkpoint's epoch.
- Save ``loader.state_dict()`` per rank, next to the model checkpoint, at the
  same step on every rank. Resume with the same world size, batch size and
  sampler arguments (the state describes a position in *this* rank's shard).
  With per-node local disks, a rank finds its file again as long as each node
  keeps its ``--node_rank``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import Dataset, DistributedSampler

from threadloader import ThreadDataLoader

#: What ``--smoke`` runs: 3 epochs of a tiny problem on CPU, with a checkpoint every 5 steps.
SMOKE: dict[str, Any] = {"epochs": 3, "samples": 90, "dim": 8, "batch_size": 4, "lr": 0.02, "save_every": 5}
#: DistributedSampler's seed: every rank must use the same one.
SAMPLER_SEED = 0


class Regression(Dataset):
    """Synthetic linear regression: sample ``i`` is ``(x_i, y_i, i)``, the same in every process.

    Each sample is generated from its own seed, so no process needs the data
    of another and the dataset costs no memory.
    """

    def __init__(self, n: int, dim: int, seed: int = 0) -> None:
        self.n, self.dim, self.seed = n, dim, seed
        self.w = torch.randn(dim, generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        x = torch.randn(self.dim, generator=g)
        y = (x @ self.w + 0.01 * torch.randn((), generator=g)).unsqueeze(0)
        return x, y, i


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(backend: str) -> tuple[int, int, int]:
    """Join the process group torchrun describes (or a group of one without torchrun).

    Returns:
        ``(rank, world_size, local_rank)``.
    """
    if "RANK" not in os.environ:  # plain `python ddp_train.py`: a world of one
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
        return 0, 1, 0
    dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0))


def host_group() -> Any:
    """A gloo group of every rank, for collectives on tensors made in Python (metrics, the checkpoint dir).

    Not the group DDP uses. Once a DDP model has used a group, torch (2.14.1)
    keeps that group and its gloo worker threads alive after
    ``destroy_process_group()``. A gloo worker releases a collective's tensors
    some time after the collective returned. If that is a tensor made in
    Python, and the interpreter is already shutting down by then, the worker
    aborts the process ("terminate called without an active exception"). This
    is rare, and more likely on a loaded machine. DDP's own traffic (its
    gradient buckets) holds no Python tensors. This group, which no DDP model
    holds, is freed by ``destroy_process_group()``, which first joins its
    threads.
    """
    return dist.new_group(backend="gloo")


def _atomic_save(obj: Any, path: Path) -> None:
    """Write then rename, so a preemption during the save never leaves a torn checkpoint."""
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    tmp.replace(path)


def save_checkpoint(ckpt_dir: Path, rank: int, world: int, model: nn.Module, opt: torch.optim.Optimizer,
                    loader: ThreadDataLoader, epoch: int, step: int) -> None:
    """Every rank saves its loader position; rank 0 also saves model and optimizer."""
    _atomic_save({"loader": loader.state_dict(), "epoch": epoch, "step": step, "world_size": world},
                 ckpt_dir / f"loader_rank{rank}.pt")
    if rank == 0:
        _atomic_save({"model": model.state_dict(), "optim": opt.state_dict(), "epoch": epoch, "step": step},
                     ckpt_dir / "model.pt")
    dist.barrier()  # the checkpoint is complete only once every rank wrote its part


def load_checkpoint(ckpt_dir: Path, rank: int, world: int, model: nn.Module, opt: torch.optim.Optimizer,
                    loader: ThreadDataLoader) -> tuple[int, int]:
    """Restore a checkpoint if there is one.

    Returns:
        ``(epoch, step)`` to continue from; ``(0, 0)`` without a checkpoint.

    Raises:
        RuntimeError: the checkpoint is incomplete or from another world size.
    """
    model_path, loader_path = ckpt_dir / "model.pt", ckpt_dir / f"loader_rank{rank}.pt"
    if not model_path.exists():
        return 0, 0
    ckpt = torch.load(model_path, map_location="cpu", weights_only=True)
    mine = torch.load(loader_path, weights_only=True)
    if mine["world_size"] != world:
        raise RuntimeError(f"checkpoint was written by {mine['world_size']} ranks, this run has {world}: "
                           "loader positions are per rank and cannot be remapped")
    if mine["step"] != ckpt["step"]:
        raise RuntimeError(f"rank {rank}: loader state is from step {mine['step']}, model from {ckpt['step']}")
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optim"])
    loader.load_state_dict(mine["loader"])  # the next iter() yields the rest of that epoch
    return ckpt["epoch"], ckpt["step"]


def _done(rows: list[dict[str, Any]], temp_dir: Path | None, rank: int, host: Any) -> list[dict[str, Any]]:
    """``rows``, once the temp checkpoint directory of a run without ``--ckpt-dir`` is removed.

    Nobody can resume from a directory nobody named: rank 0 removes it when
    every rank has written its last checkpoint (after a barrier).
    """
    if temp_dir is not None:
        dist.barrier(group=host)
        if rank == 0:
            shutil.rmtree(temp_dir, ignore_errors=True)
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Train; returns one row per epoch run in this process (this rank's view).

    Args:
        argv: command-line arguments (see ``--help``).
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=256, help="per rank")
    parser.add_argument("--workers", type=int, default=None,
                        help="loader threads per process (default: cores per process)")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--ckpt-dir", type=Path, default=None,
                        help="shared by all ranks (default: a temp dir, removed when the run ends)")
    parser.add_argument("--save-every", type=int, default=100, help="checkpoint every N steps (--smoke: 5)")
    parser.add_argument("--stop-after", type=int, default=None,
                        help="exit right after the checkpoint at this step (simulates preemption)")
    parser.add_argument("--log-dir", type=Path, default=None,
                        help="write the sample indices each rank trained on, and final results, here")
    parser.add_argument("--smoke", action="store_true", help="CPU, gloo, tiny model and data: seconds")
    args = parser.parse_args(argv)
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)

    use_cuda = torch.cuda.is_available() and not args.smoke
    rank, world, local_rank = init_distributed("nccl" if use_cuda else "gloo")
    temp_dir: Path | None = None
    try:
        host = host_group()
        if use_cuda:
            torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        workers = args.workers if args.workers is not None else max(1, (os.cpu_count() or 2) // local_world)
        if args.smoke:
            workers = min(workers, 2)

        ckpt_dir = args.ckpt_dir
        if ckpt_dir is None:  # one temp dir, chosen by rank 0 (one node only)
            box = [tempfile.mkdtemp(prefix="ddp_train_") if rank == 0 else None]
            dist.broadcast_object_list(box, src=0, group=host)
            ckpt_dir = temp_dir = Path(box[0])
        ckpt_dir.mkdir(parents=True, exist_ok=True)

        torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts them)
        dataset = Regression(args.samples, args.dim)
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=SAMPLER_SEED)
        loader = ThreadDataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=workers,
                                  pin_memory=use_cuda, persistent_workers=True, drop_last=True)
        model = DDP(nn.Linear(args.dim, 1).to(device), device_ids=[local_rank] if use_cuda else None)
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        start_epoch, step = load_checkpoint(ckpt_dir, rank, world, model.module, opt, loader)

        # Indices trained on since the last checkpoint: written when a checkpoint
        # commits them, so the log shows exactly the work a resume keeps.
        pending: list[tuple[int, list[int]]] = []
        log = None
        if args.log_dir is not None:
            args.log_dir.mkdir(parents=True, exist_ok=True)
            log = open(args.log_dir / f"seen_rank{rank}.jsonl", "a", encoding="utf-8")

        def commit() -> None:
            if log is not None:
                for e, idx in pending:
                    log.write(json.dumps({"epoch": e, "indices": idx}) + "\n")
                log.flush()
            pending.clear()

        rows: list[dict[str, Any]] = []
        try:
            for epoch in range(start_epoch, args.epochs):
                sampler.set_epoch(epoch)  # every rank, every epoch, also the resumed one
                total, count = torch.zeros((), device=device), 0
                for x, y, idx in loader:
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                    loss = nn.functional.mse_loss(model(x), y)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    step += 1
                    total += loss.detach() * len(idx)
                    count += len(idx)
                    pending.append((epoch, idx.tolist()))
                    if step % args.save_every == 0:
                        save_checkpoint(ckpt_dir, rank, world, model.module, opt, loader, epoch, step)
                        commit()
                        if args.stop_after is not None and step >= args.stop_after:
                            return _done(rows, temp_dir, rank, host)  # "preempted" right after a checkpoint
                stats = torch.stack([total, torch.tensor(float(count), device=device)]).cpu()
                dist.all_reduce(stats, group=host)
                snap = loader.stats().snapshot() if loader.stats() is not None else {"items_per_s": 0.0}
                row = {"rank": rank, "epoch": epoch, "step": step, "loss": (stats[0] / stats[1].clamp(min=1)).item(),
                       "samples": int(stats[1].item()), "loader": snap["items_per_s"]}
                rows.append(row)
                if rank == 0:
                    print(f"epoch {epoch}: loss {row['loss']:.5f}, step {step}, "
                          f"{row['samples']} samples, rank 0 loader {row['loader']:.0f} items/s", flush=True)
            commit()
            if args.log_dir is not None:
                params = [p.detach().cpu().flatten().tolist() for p in model.module.parameters()]
                (args.log_dir / f"final_rank{rank}.json").write_text(
                    json.dumps({"rank": rank, "world": world, "step": step, "params": params, "rows": rows}))
        finally:
            if log is not None:
                log.close()
        return _done(rows, temp_dir, rank, host)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
