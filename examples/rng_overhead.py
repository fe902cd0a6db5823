"""What threadloader's per-worker RNG routing costs the training loop (and the workers).

Inside worker threads, threadloader sends the global RNG API (``torch.rand``,
``random.random``, ``np.random.rand``, ``torch.manual_seed``...) to the worker's
own generators. This measures, in one run and side by side, the cost per call
in the *main thread* (the training loop) with the routing installed and with it
removed, while worker threads of a running ThreadDataLoader draw random numbers
-- and, for reference, the per-op cost inside a worker thread: a torch op that
draws nothing costs what it costs in any thread; a random op gets the worker's
generator passed.

    python examples/rng_overhead.py [--calls 200000] [--repeat 7] [--smoke]
"""

from __future__ import annotations

import argparse
import random
import threading
import timeit

import numpy as np
import torch

import threadloader  # noqa: F401  (installs the routing)
from threadloader import worker
from threadloader.worker import rng as _rng


def _per_call_ns(fn, calls: int, repeat: int) -> float:
    return min(timeit.repeat(fn, number=calls, repeat=repeat)) / calls * 1e9


CASES = {
    "torch.rand(1)": lambda: torch.rand(1),
    "torch.empty(4).uniform_()": lambda: torch.empty(4).uniform_(),
    "random.random()": lambda: random.random(),
    "random.randint(0, 9)": lambda: random.randint(0, 9),
    "np.random.rand()": lambda: np.random.rand(),
    "torch.initial_seed()": lambda: torch.initial_seed(),
}


def main_thread_costs(calls: int, repeat: int) -> dict[str, tuple[float, float]]:
    """Per-call ns in this thread: (routing removed, routing installed), interleaved."""
    out: dict[str, list[float]] = {name: [float("inf"), float("inf")] for name in CASES}
    for _ in range(repeat):  # alternate so machine noise hits both sides alike
        for installed in (False, True):
            (_rng.install if installed else _rng.uninstall)()
            for name, fn in CASES.items():
                # The lambdas look the module attributes up on every call.
                out[name][installed] = min(out[name][installed], _per_call_ns(fn, calls, 1))
    _rng.install()
    return {k: (v[0], v[1]) for k, v in out.items()}


def worker_op_cost(calls: int, repeat: int) -> dict[str, tuple[float, float]]:
    """Per-call ns of a non-random and a random torch op in a thread: (plain thread, worker thread)."""
    x = torch.zeros(8)
    ops = {"x.add(1)": lambda: x.add(1), "torch.rand(8)": lambda: torch.rand(8)}
    result: dict[tuple[str, bool], float] = {}

    def body(as_worker: bool) -> None:
        if as_worker:
            worker.enter_worker(0, 1, 0, None)
        try:
            for name, fn in ops.items():
                result[name, as_worker] = _per_call_ns(fn, calls, repeat)
        finally:
            if as_worker:
                worker.leave_worker()

    for as_worker in (False, True):
        t = threading.Thread(target=body, args=(as_worker,))
        t.start()
        t.join()
    return {name: (result[name, False], result[name, True]) for name in ops}


def main(argv: list[str] | None = None) -> list[dict]:
    """Print the table; return one row per measured call."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--smoke", action="store_true", help="a few calls only (seconds)")
    parser.add_argument("--cache-dir", help="unused (every example takes it)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.calls, args.repeat = 2000, 2

    # Worker threads drawing through the global API while the main thread is measured.
    class Draws(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 10**9

        def __getitem__(self, i: int):
            return torch.rand(1) + random.random() + np.random.rand()

    loader = threadloader.ThreadDataLoader(Draws(), batch_size=64, num_workers=2, prefetch_factor=1)
    it = iter(loader)
    next(it)  # workers are up; with the queues full they idle (the GIL stays with us)
    try:
        costs = main_thread_costs(args.calls, args.repeat)
    finally:
        del it
    rows = [{"call": name, "not_installed_ns": off, "installed_ns": on, "ratio": on / off}
            for name, (off, on) in costs.items()]
    print(f"main thread, per call (min of {args.repeat}, {args.calls} calls each), workers alive:")
    print(f"{'call':30s} {'not installed':>14s} {'installed':>10s} {'ratio':>6s}")
    for name, (off, on) in costs.items():
        print(f"{name:30s} {off:11.0f} ns {on:7.0f} ns {on / off:6.2f}")
    print("\ninside a thread, per call (the worker's draws get its generator passed):")
    for name, (plain, in_worker) in worker_op_cost(args.calls // 4, args.repeat).items():
        print(f"  {name:14s} plain thread {plain:6.0f} ns, worker thread {in_worker:6.0f} ns "
              f"({in_worker - plain:+.0f} ns)")
        rows.append({"call": f"worker thread {name}", "not_installed_ns": plain, "installed_ns": in_worker,
                     "ratio": in_worker / plain})
    return rows


if __name__ == "__main__":
    main()
