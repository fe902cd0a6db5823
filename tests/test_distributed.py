"""ThreadDataLoader under torchrun: 2 ranks, gloo on 127.0.0.1.

The ranks run tests/distributed_worker.py (and, once, examples/ddp_train.py in
smoke mode) and write JSON; this process checks it against what
DistributedSampler promises, against torch's DataLoader, and across a
checkpoint/resume in a second launch.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
WORKER = HERE / "distributed_worker.py"
DDP_EXAMPLE = HERE.parent / "examples" / "ddp_train.py"
WORLD = 2
#: Per launch. Three Python processes importing torch on a loaded 2-core
#: machine take ~10-20 s; the limit only catches hangs, so it is generous.
LAUNCH_TIMEOUT_S = 180

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(),
    reason="torch.distributed with the gloo backend is not available",
)


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("tl_" + path.stem, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID"}}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    # gloo picks its interface from the hostname, which may resolve to an
    # address that is not reachable here; loopback always is.
    if any(name == "lo" for _, name in socket.if_nameindex()):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def torchrun(script: Path, *args: str) -> str:
    """Run ``script`` on WORLD local ranks with torchrun; fail the test with every rank's output.

    Returns:
        The combined stdout/stderr of torchrun and its ranks.
    """
    output = ""
    for attempt in range(2):  # a second try only if another process took the port in between
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={WORLD}", "--nnodes=1",
               "--master_addr=127.0.0.1", f"--master_port={_free_port()}", str(script), *args]
        # A session of its own for torchrun; its ranks (which hold the output
        # pipe open) are each in a session of their own, so a hang kills them
        # by pid too: killing torchrun alone would block the wait below.
        # TMPDIR: torchrun leaves a torchelastic_* log directory behind in it.
        with tempfile.TemporaryDirectory(prefix="torchrun_") as tmp:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    env=dict(_env(), TMPDIR=tmp), start_new_session=True)
            try:
                output, _ = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                import psutil  # a test dependency

                family = psutil.Process(proc.pid).children(recursive=True)
                os.killpg(proc.pid, signal.SIGKILL)
                for p in family:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        p.kill()
                output, _ = proc.communicate()
                pytest.fail(f"torchrun timed out after {LAUNCH_TIMEOUT_S} s: {' '.join(cmd)}\n{output[-8000:]}")
        if proc.returncode == 0:
            return output
        if attempt == 0 and ("Address already in use" in output or "EADDRINUSE" in output):
            continue
        break
    pytest.fail(f"torchrun exited with {proc.returncode}: {' '.join(cmd)}\n--- ranks' output ---\n{output[-8000:]}")


def sampler_order(n: int, world: int, rank: int, seed: int, epoch: int, drop_last: bool) -> list[int]:
    """The indices DistributedSampler(shuffle=True) promises to ``rank``, from its documented algorithm.

    A permutation from ``seed + epoch``; without drop_last it is padded to a
    multiple of the world size by repeating its first indices, with drop_last
    truncated; rank r takes every world-th index starting at r.
    """
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    if drop_last:
        full = perm[: n // world * world]
    else:
        total = math.ceil(n / world) * world
        full = (perm * math.ceil(total / n))[:total]
    return full[rank::world]


def chunk(indices: list[int], batch_size: int, drop_last: bool) -> list[list[int]]:
    out = [indices[i:i + batch_size] for i in range(0, len(indices), batch_size)]
    return out[:-1] if drop_last and out and len(out[-1]) < batch_size else out


def batch_indices(batches: list[list]) -> list[list[int]]:
    return [b[0] for b in batches]


# --- tests/distributed_worker.py ------------------------------------------------

@pytest.fixture(scope="module")
def worker_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both launches: the uninterrupted/oracle/preempted run, then the resume."""
    out = tmp_path_factory.mktemp("tl-distributed")
    torchrun(WORKER, "run", "--out", str(out))
    torchrun(WORKER, "resume", "--out", str(out))
    results: dict[str, Any] = {"module": _load(WORKER)}
    for phase in ("run", "resume"):
        results[phase] = [json.loads((out / f"{phase}_rank{r}.json").read_text()) for r in range(WORLD)]
    return results


def configs(results: dict[str, Any]) -> dict[str, tuple]:
    return results["module"].CONFIGS


def test_every_rank_reports_and_collectives_ran(worker_results: dict[str, Any]) -> None:
    for phase in ("run", "resume"):
        ranks = worker_results[phase]
        assert [r["rank"] for r in ranks] == list(range(WORLD))
        assert all(r["world"] == WORLD for r in ranks)
        # The all_reduce over gloo ran after the loaders and agrees with what each rank reported.
        mine = [sum(len(b[0]) for cfg in r["configs"].values() for run in cfg.values() for ep in run for b in ep)
                for r in ranks]
        assert all(r["all_reduced_samples"] == sum(mine) for r in ranks)


def test_each_epoch_covers_the_dataset_as_distributed_sampler_promises(worker_results: dict[str, Any]) -> None:
    mod = worker_results["module"]
    for name, (n, batch_size, sampler_drop_last, loader_drop_last, _) in configs(worker_results).items():
        for epoch in range(mod.EPOCHS):
            per_rank = [batch_indices(worker_results["run"][r]["configs"][name]["thread"][epoch])
                        for r in range(WORLD)]
            for r in range(WORLD):
                expected = sampler_order(n, WORLD, r, mod.SEED, epoch, sampler_drop_last)
                assert per_rank[r] == chunk(expected, batch_size, loader_drop_last), (name, epoch, r)
            seen = [i for batches in per_rank for b in batches for i in b]
            assert set(seen) <= set(range(n))
            if loader_drop_last:
                assert len(seen) == len(set(seen)), (name, epoch)  # truncated: nothing twice
                continue
            # Interleave the ranks back into the sampler's global order.
            flat = [[i for b in batches for i in b] for batches in per_rank]
            total = sum(map(len, flat))
            full = [flat[k % WORLD][k // WORLD] for k in range(total)]
            if sampler_drop_last:
                assert total == n // WORLD * WORLD and len(set(full)) == total, (name, epoch)
            else:
                # Every index exactly once, plus padding that repeats the first few.
                assert total == math.ceil(n / WORLD) * WORLD, (name, epoch)
                assert sorted(full[:n]) == list(range(n)), (name, epoch)
                assert full[n:] == full[: total - n], (name, epoch)
            assert len(set(tuple(f) for f in flat)) == WORLD  # the ranks really got different shards


def test_batches_equal_torch_dataloader(worker_results: dict[str, Any]) -> None:
    for r in range(WORLD):
        for name, runs in worker_results["run"][r]["configs"].items():
            assert runs["thread"] == runs["oracle"], (name, r)
            for epoch in runs["thread"]:  # the collated tensors belong to their indices
                for idx, tensors in epoch:
                    assert tensors == [[i, -i] for i in idx]


def test_resume_per_rank_gives_the_uninterrupted_run(worker_results: dict[str, Any]) -> None:
    mod = worker_results["module"]
    for r in range(WORLD):
        for name in configs(worker_results):
            full = worker_results["run"][r]["configs"][name]["thread"]
            partial = worker_results["run"][r]["configs"][name]["partial"]
            resumed = worker_results["resume"][r]["configs"][name]["resumed"]
            assert len(partial[mod.STOP_EPOCH]) == mod.stop_batch(name, r)
            assert resumed[0], "the checkpoint must be mid-epoch for this test to mean anything"
            stitched = partial[: mod.STOP_EPOCH] + [partial[mod.STOP_EPOCH] + resumed[0]] + resumed[1:]
            assert stitched == full, (name, r)


def test_datapipe_ranks_shuffle_alike_and_resume_between_epochs(worker_results: dict[str, Any]) -> None:
    """A DataPipe graph under torch.distributed, ranks' RNGs differing: as DataLoader, resume included.

    DataLoader broadcasts rank 0's shuffle seed; a resumed ThreadDataLoader
    must take rank 0's too, or the ranks' shards overlap.
    """
    mod = worker_results["module"]
    ranks = [r["datapipe"] for r in worker_results["run"]]
    for key in ranks[0]:
        for r in range(WORLD):
            runs = ranks[r][key]
            assert runs["thread"] == runs["oracle"], (key, r)
            assert runs["first"] + runs["resumed"] == runs["oracle"], (key, r)
        for epoch in range(mod.EPOCHS):
            seen = [i for r in range(WORLD) for b in ranks[r][key]["oracle"][epoch] for i in b]
            assert sorted(seen) == list(range(mod.DATAPIPE_N)), (key, epoch)  # the oracle's shards are disjoint
        assert ranks[0][key]["oracle"][0] != ranks[0][key]["oracle"][1]  # the epochs shuffle anew


# --- examples/ddp_train.py --------------------------------------------------------

def test_ddp_example_smoke_preempted_and_resumed(tmp_path: Path) -> None:
    """The example trains under torchrun, is "preempted" mid-epoch, and a relaunch finishes exactly."""
    example = _load(DDP_EXAMPLE)
    smoke = example.SMOKE
    ckpt, log = tmp_path / "ckpt", tmp_path / "log"
    common = ("--smoke", "--ckpt-dir", str(ckpt), "--log-dir", str(log))
    per_rank = smoke["samples"] // WORLD
    steps_per_epoch = per_rank // smoke["batch_size"]  # the example uses drop_last=True
    stop = 3 * smoke["save_every"]
    assert steps_per_epoch < stop < 2 * steps_per_epoch, "stop in the middle of epoch 1"

    torchrun(DDP_EXAMPLE, *common, "--stop-after", str(stop))
    assert {p.name for p in ckpt.iterdir()} >= {"model.pt", *(f"loader_rank{r}.pt" for r in range(WORLD))}
    assert not list(log.glob("final_rank*.json"))
    torchrun(DDP_EXAMPLE, *common)  # the same command again: it resumes

    finals = [json.loads((log / f"final_rank{r}.json").read_text()) for r in range(WORLD)]
    assert all(f["step"] == smoke["epochs"] * steps_per_epoch for f in finals)
    assert finals[0]["params"] == finals[1]["params"]  # DDP kept the replicas identical
    for r in range(WORLD):
        seen: dict[int, list[int]] = {}
        for line in (log / f"seen_rank{r}.jsonl").read_text().splitlines():
            rec = json.loads(line)
            seen.setdefault(rec["epoch"], []).extend(rec["indices"])
        # Each sample trained on exactly once per epoch across the preemption, in the sampler's order.
        for epoch in range(smoke["epochs"]):
            expected = sampler_order(smoke["samples"], WORLD, r, example.SAMPLER_SEED, epoch, False)
            assert seen.get(epoch) == expected[: steps_per_epoch * smoke["batch_size"]], (r, epoch)


_SPY = """
import json, runpy, sys
import torch.distributed as dist

calls = []

def spy(fn):
    def wrapped(*args, group=None, **kwargs):
        default = group is None or group == dist.group.WORLD
        calls.append((fn.__name__, "ddp group" if default else "other group"))
        return fn(*args, group=group, **kwargs)
    return wrapped

for name in ("all_reduce", "broadcast", "all_gather", "reduce", "broadcast_object_list", "all_gather_object"):
    setattr(dist, name, spy(getattr(dist, name)))
example = sys.argv[1]
sys.argv = [example, "--smoke"]  # no --ckpt-dir: rank 0 broadcasts a temp dir
runpy.run_path(example, run_name="__main__")
print("CALLS " + json.dumps(calls))
"""


def test_ddp_example_keeps_python_tensors_off_the_ddp_group() -> None:
    """Collectives on tensors made in Python go through a group no DDP model holds.

    torch keeps a group that DDP used (and its gloo threads) alive past
    destroy_process_group(); a gloo thread releasing a Python tensor during
    interpreter shutdown aborts the rank (seen in CI: "terminate called without
    an active exception", SIGABRT after the last epoch). See host_group().
    """
    proc = subprocess.run([sys.executable, "-c", _SPY, str(DDP_EXAMPLE)], capture_output=True, text=True,
                          env=_env(), timeout=LAUNCH_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("CALLS "))
    calls = [tuple(c) for c in json.loads(line[len("CALLS "):])]
    assert ("broadcast_object_list", "other group") in calls and ("all_reduce", "other group") in calls, calls
    assert all(where == "other group" for _, where in calls), calls
