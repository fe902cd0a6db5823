"""A dataset whose ``__getitem__`` is pure Python: GIL build against free-threaded build.

The worst case for threads on a GIL build: every sample is Python bytecode
(here, parsing and checksumming a synthetic text record), so worker threads
take turns on the GIL and 2 workers load no faster than 1. On a free-threaded
CPython (3.13t/3.14t) running with the GIL off, the same threads run at once.
Batches of 16 by default: unbatched with cheap items (``--batch-size 0
--fields 60``), the training loop's own per-item Python, on one thread, limits
the scaling instead.

Each interpreter given with ``--python`` runs the same measurement in a child
process (``PYTHONPATH`` points at this checkout). ``PYTHON_GIL=0`` is set for
free-threaded builds; ``--ft-gil-on`` adds a run of each with ``PYTHON_GIL=1``.
Rounds are interleaved: interpreter A at 1, 2, ... workers, then B, then A
again. Each figure is the median over ``--repeats`` rounds, so a noisy machine
biases both alike. Read the ratios
(items/s at N workers over items/s at 1 worker, same interpreter), not the
absolute figures.

Usage::

    python examples/free_threaded_benchmark.py --python python3.11 --python .venv-ft/bin/python
    python examples/free_threaded_benchmark.py --python A --python B --workers 1,2,4,8,16
    python examples/free_threaded_benchmark.py --python .venv-ft/bin/python --ft-gil-on  # same build, GIL on/off
    python examples/free_threaded_benchmark.py --smoke     # this interpreter only, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


class PythonRecords:
    """Item i: a synthetic ``key=value`` record parsed and checksummed in Python."""

    def __init__(self, n: int, fields: int) -> None:
        self.n = n
        self.fields = fields

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        record = ";".join(f"k{j}={(i * 31 + j * 17) % 1009}" for j in range(self.fields))
        total = 0
        for part in record.split(";"):
            key, _, value = part.partition("=")
            total = (total * 33 + int(value) + len(key)) & 0xFFFFFFFF
        return total ^ zlib.crc32(record.encode()) & 0xFF


def measure(workers: int, items: int, fields: int, batch_size: int | None) -> float:
    """Items per second through ThreadDataLoader, after the first batch."""
    from threadloader import ThreadDataLoader

    per_batch = batch_size or 1
    loader = ThreadDataLoader(PythonRecords(items + per_batch, fields), batch_size=batch_size, num_workers=workers)
    it = iter(loader)
    next(it)  # threads started, first batch out: start-up is not timed
    start = time.perf_counter()
    count = sum(1 for _ in it)
    return count * per_batch / (time.perf_counter() - start)


def describe() -> dict[str, Any]:
    """This interpreter: version, build and whether the GIL is on now."""
    from threadloader._platform.interpreter import FREE_THREADED_BUILD, gil_enabled

    return {"python": sys.version.split()[0], "free_threaded": FREE_THREADED_BUILD, "gil": gil_enabled()}


def child(workers: list[int], items: int, fields: int, batch_size: int | None) -> dict[str, Any]:
    rates = {w: measure(w, items, fields, batch_size) for w in workers}
    return {**describe(), "rates": rates}


def is_free_threaded(python: str) -> bool:
    probe = subprocess.run([python, "-c", "import sysconfig; print(bool(sysconfig.get_config_var('Py_GIL_DISABLED')))"],
                           capture_output=True, text=True, check=True)
    return probe.stdout.strip() == "True"


def run_child(python: str, gil: str | None, workers: list[int], items: int, fields: int,
              batch_size: int | None) -> dict[str, Any]:
    """One round in ``python``; ``gil`` is PYTHON_GIL's value ("0", "1") or None to leave it unset."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("PYTHON_GIL", None)
    if gil is not None:
        env["PYTHON_GIL"] = gil
    cmd = [python, __file__, "--child", "--workers", ",".join(map(str, workers)),
           "--items", str(items), "--fields", str(fields), "--batch-size", str(batch_size or 0)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{python} failed:\n{out.stderr.strip()}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["rates"] = {int(k): v for k, v in result["rates"].items()}
    return result


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    from threadloader.bench import parse_workers

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", action="append", default=[], help="an interpreter to measure (repeatable)")
    p.add_argument("--workers", type=parse_workers, default=[1, 2])
    p.add_argument("--items", type=int, default=8000, help="items per measurement")
    p.add_argument("--fields", type=int, default=300,
                   help="record fields: the Python work per item (300: about 0.4 ms on CPython 3.11)")
    p.add_argument("--batch-size", type=int, default=16, help="0: unbatched (the loop's per-item cost then counts)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--ft-gil-on", action="store_true",
                   help="also measure each free-threaded interpreter with the GIL on (PYTHON_GIL=1)")
    p.add_argument("--smoke", action="store_true", help="this interpreter, few items, one round")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", help=argparse.SUPPRESS)  # the examples' smoke-test interface
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.workers, args.items, args.fields, args.batch_size or None)))
        return []
    if args.smoke:
        args.items, args.fields, args.repeats = 160, 30, 1
    configs: list[tuple[str, str | None]] = []  # (interpreter, PYTHON_GIL)
    for py in args.python or [sys.executable]:
        if is_free_threaded(py):
            configs += [(py, "0")] + ([(py, "1")] if args.ft_gil_on else [])
        else:
            configs.append((py, None))
    runs: dict[tuple[str, str | None], list[dict[str, Any]]] = {c: [] for c in configs}
    for _ in range(args.repeats):
        for py, gil in configs:  # interleaved: each round measures every configuration
            runs[(py, gil)].append(run_child(py, gil, args.workers, args.items, args.fields, args.batch_size or None))
    rows = []
    print(f"{'python':<10} {'build':<14} {'GIL':<4} {'workers':>7} {'items/s':>10} {'vs 1 worker':>12}")
    for config in configs:
        py = config[0]
        info = runs[config][0]
        rates = {w: statistics.median(r["rates"][w] for r in runs[config]) for w in args.workers}
        base = rates.get(1, rates[args.workers[0]])
        for w in args.workers:
            row = {"python": info["python"], "free_threaded": info["free_threaded"], "gil": info["gil"],
                   "workers": w, "items/s": rates[w], "ratio": rates[w] / base, "interpreter": py}
            rows.append(row)
            build = "free-threaded" if info["free_threaded"] else "GIL"
            print(f"{info['python']:<10} {build:<14} {'on' if info['gil'] else 'off':<4} {w:>7} "
                  f"{rates[w]:>10.0f} {rates[w] / base:>11.2f}x")
    return rows


if __name__ == "__main__":
    main()
