"""``python -m threadloader bench --zoo``: DataLoader against ThreadDataLoader's modes on the workload zoo.

Loaders, side by side in one run on every workload of :mod:`.zoo_data`:

* ``DataLoader``: torch's DataLoader, ``num_workers`` worker processes;
* ``default``: ThreadDataLoader with default arguments;
* ``threads``: ThreadDataLoader, ``worker_processes=0`` (threads of this process);
* ``processes``: ThreadDataLoader, ``worker_processes=P`` (P = the workers,
  one per process as in DataLoader; ``--worker-processes`` sets it).

Every cell (workload, workers, loader) is timed once per round, rounds
interleaved and the loaders' order changed from round to round (each runs
first, and after each other one, equally often: :func:`balanced_order`), so
that machine noise hits all of them alike. A cell's rate is the median over the
rounds; its ratio is the median of the rounds' ratios, each taken against
DataLoader's rate in the same round (a machine that slows for a while slows
both sides of a round's ratio), and the lowest and highest of them show the spread.
The first batches, as many as the loader keeps in flight, are not timed
(start-up). Ratios are rates over DataLoader's in the same run.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

from threadloader.bench.data import BenchError
from threadloader.bench.measure import in_flight_depth, measure
from threadloader.bench.pipelines import Cycle, import_torchvision
from threadloader.bench.torch_call import TorchCallCost, torch_call_cost
from threadloader.bench.usage import usable_cores
from threadloader.bench.zoo_data import SCALES, WORKLOADS, Scale, Workload, build_workload

__all__ = [
    "LOADERS",
    "ZooRow",
    "balanced_order",
    "format_zoo_table",
    "run_zoo",
    "target_lines",
    "Timed",
    "time_cell",
    "write_zoo_plot",
    "zoo_processes",
]

BASELINE = "DataLoader"
DEFAULT = "default"
THREADS = "threads"
PROCESSES = "processes"
LOADERS = (BASELINE, DEFAULT, THREADS, PROCESSES)

#: Rounds per mode (each cell is timed once per round; the median is kept).
#: Four: the balanced order of four loaders comes round in four rounds.
_ROUNDS = {"full": 4, "quick": 3, "smoke": 1}


class ZooRow(NamedTuple):
    """The median of one cell over the rounds."""

    workload: str
    workers: int
    loader: str
    #: Samples (items, unbatched) per second; None when a round failed.
    rate: float | None
    #: The median of the rounds' ratios: the cell's rate over DataLoader's in the same round.
    ratio: float | None
    #: ``worker_processes`` of the cell (0: threads; None: DataLoader or the default).
    processes: int | None
    note: str = ""
    #: The default's rounds whose workers moved into processes (None for the other loaders).
    moved: int | None = None
    #: Rounds timed.
    rounds: int = 0
    #: The lowest and highest of the rounds' ratios (None when a round failed).
    low: float | None = None
    high: float | None = None
    #: The median of the rounds' page faults per sample (this process and its children; None: unknown).
    faults: float | None = None
    #: The default's rounds whose workers moved into the consumer's thread (None for the other loaders).
    inlined: int | None = None


def zoo_processes(workers: int, requested: int | None = None) -> int:
    """P of the ``processes`` rows: ``requested``, else ``workers``; never more than ``workers``.

    One worker per process by default: DataLoader's own process count, so that
    the rows compare the process layers on the same split of the work.
    """
    return max(1, min(workers, requested or workers))


def _loader(
    name: str, dataset: Any, collate: Callable[[list[Any]], Any] | None, batch_size: int | None,
    workers: int, samples: int, processes: int,
) -> Any:
    kwargs: dict[str, Any] = {"batch_size": batch_size, "num_workers": workers,
                              "sampler": Cycle(len(dataset), samples)}
    if collate is not None:
        kwargs["collate_fn"] = collate
    if name == BASELINE:
        return torch.utils.data.DataLoader(dataset, **kwargs)
    from threadloader import ThreadDataLoader

    if name == THREADS:
        kwargs["worker_processes"] = 0
    elif name == PROCESSES:
        kwargs["worker_processes"] = processes
    return ThreadDataLoader(dataset, **kwargs)


class Timed(NamedTuple):
    """One timing of one cell."""

    rate: float  # samples (items, unbatched) per second
    moved: bool  # the default's workers ended in processes
    faults: float | None = None  # page faults per sample, this process and its children (None: unknown)
    inlined: bool = False  # the default's workers ended in the consumer's thread


def time_cell(
    name: str, dataset: Any, collate: Callable[[list[Any]], Any] | None, batch_size: int | None,
    workers: int, timed: int, processes: int,
) -> Timed:
    """Samples per second of loader ``name`` over ``timed`` batches (items, unbatched), after the in-flight depth.

    Raises:
        BenchError: the loader produced fewer items than asked.
    """
    warmup = in_flight_depth(workers) + 1
    per_item = batch_size or 1
    loader = _loader(name, dataset, collate, batch_size, workers, (warmup + timed) * per_item, processes)
    m = measure(loader, max_items=warmup + timed, warmup=warmup, counter=lambda _: per_item)
    if not m.complete or m.seconds <= 0:
        raise BenchError(f"{name}: {m.timed_items} items timed, expected {timed}")
    stats = loader.stats() if name == DEFAULT else None
    faults = m.page_faults / m.images if m.page_faults is not None and m.images else None
    mode = stats.mode if stats is not None else ""
    return Timed(m.img_per_s, mode.startswith("processes"), faults, mode.startswith("inline"))


def _timed(workload: Workload, scale: Scale) -> int:
    return max(1, round(workload.batches * scale.batches))


def balanced_order(items: Sequence[str], k: int) -> list[str]:
    """Order ``k`` of ``items`` in a Williams design: each runs first, and after each other one, equally often.

    Over ``len(items)`` consecutive orders (twice that for an odd count).

    A plain rotation keeps every item behind the same neighbour in every
    order; whatever a loader leaves behind (a process still exiting, memory
    to give back) would then always fall on the same next loader.
    """
    n = len(items)
    base, low, high = [0], 1, n - 1
    while len(base) < n:
        base.append(low)
        low += 1
        if len(base) < n:
            base.append(high)
            high -= 1
    order = [items[(i + k) % n] for i in base]
    # With an odd count the orders and their reverses together balance the neighbours.
    return order[::-1] if n % 2 and (k // n) % 2 else order


def measure_zoo(
    workloads: Sequence[Workload], workers: Sequence[int], scale: Scale, *, rounds: int,
    cache_dir: str | os.PathLike[str] | None, processes: int | None, progress: bool = True,
) -> list[ZooRow]:
    """Time every (workload, workers, loader) cell ``rounds`` times, interleaved; one row per cell (medians)."""
    built = {w.name: build_workload(w, scale, cache_dir) for w in workloads}
    rates: dict[tuple[str, int, str], list[float]] = {}
    moves: dict[tuple[str, int, str], int] = {}  # rounds in which the default moved into processes
    inlines: dict[tuple[str, int, str], int] = {}  # rounds in which it moved into the consumer's thread
    faults: dict[tuple[str, int, str], list[float]] = {}
    errors: dict[tuple[str, int, str], str] = {}
    for r in range(rounds):
        t0 = time.perf_counter()
        for n in workers:
            p = zoo_processes(n, processes)
            for w in workloads:
                dataset, collate = built[w.name]
                for name in balanced_order(LOADERS, r + n):
                    key = (w.name, n, name)
                    if key in errors:
                        continue
                    try:
                        timing = time_cell(name, dataset, collate, w.batch_size, n, _timed(w, scale), p)
                        rates.setdefault(key, []).append(timing.rate)
                        moves[key] = moves.get(key, 0) + timing.moved
                        inlines[key] = inlines.get(key, 0) + timing.inlined
                        if timing.faults is not None:
                            faults.setdefault(key, []).append(timing.faults)
                    except Exception as e:  # noqa: BLE001 - one failed cell must not end the zoo
                        errors[key] = f"failed: {type(e).__name__}: {e}".splitlines()[0][:160]
        if progress:
            print(f"zoo round {r + 1}/{rounds} done in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    rows = []
    for n in workers:
        p = zoo_processes(n, processes)
        for w in workloads:
            base = rates.get((w.name, n, BASELINE)) if (w.name, n, BASELINE) not in errors else None
            for name in LOADERS:
                key = (w.name, n, name)
                timed = rates.get(key, [])
                got = timed if key not in errors else []
                rate = statistics.median(got) if got else None
                ratios = [a / b for a, b in zip(got, base)] if got and base and len(got) == len(base) else []
                ratio = statistics.median(ratios) if ratios else None
                procs = {THREADS: 0, PROCESSES: p}.get(name)
                moved = moves.get(key, 0) if name == DEFAULT and timed else None
                inlined = inlines.get(key, 0) if name == DEFAULT and timed else None
                faulted = faults.get(key)
                rows.append(ZooRow(w.name, n, name, rate, ratio, procs, errors.get(key, ""), moved, len(timed),
                                   min(ratios, default=None), max(ratios, default=None),
                                   statistics.median(faulted) if faulted and key not in errors else None, inlined))
    return rows


# ----------------------------------------------------------------------------- report


def format_zoo_table(rows: Sequence[ZooRow]) -> str:
    """One line per (workload, workers): DataLoader's rate and every other loader's ratio to it."""
    head = f"{'workload':16s} {'workers':>7s} {'DataLoader/s':>12s} " + " ".join(
        f"{name + (' P=' + str(_p(rows, name)) if name == PROCESSES else ''):>14s}" for name in LOADERS[1:])
    lines = [head, "-" * len(head)]
    by_key = {(r.workload, r.workers, r.loader): r for r in rows}
    cells = sorted({(r.workload, r.workers) for r in rows}, key=lambda k: (k[1], _order(k[0])))
    for workload, workers in cells:
        base = by_key[(workload, workers, BASELINE)]
        line = f"{workload:16s} {workers:7d} {_rate(base):>12s} "
        line += " ".join(f"{_ratio(by_key.get((workload, workers, name))):>14s}" for name in LOADERS[1:])
        lines.append(line)
    notes = [f"{r.workload} w={r.workers} {r.loader}: {r.note}" for r in rows if r.note]
    moved = [f"{r.workload} w={r.workers} ({r.moved}/{r.rounds})" for r in rows if r.moved]
    inlined = [f"{r.workload} w={r.workers} ({r.inlined}/{r.rounds})" for r in rows if r.inlined]
    if any(r.moved is not None for r in rows):
        notes.append("default moved into processes in: " + (", ".join(moved) if moved else "no cell")
                     + (f"; into the consumer's thread in: {', '.join(inlined)}" if inlined else "")
                     + "; elsewhere it stayed on threads")
    faulting = _faulting(rows, by_key)
    if faulting is not None:
        notes.append(faulting)
    return "\n".join(lines + notes)


#: A loader "faults more" than DataLoader in a cell from twice DataLoader's page faults per sample and this many more.
FAULTS_MORE = 16


def _faulting(rows: Sequence[ZooRow], by_key: dict[tuple[str, int, str], ZooRow]) -> str | None:
    """The note on page faults per sample: the cells where a loader faults more than DataLoader (None: unknown)."""
    known = [r for r in rows if r.loader != BASELINE and r.faults is not None]
    if not known:
        return None
    more = []
    for r in known:
        base = by_key.get((r.workload, r.workers, BASELINE))
        if base is None or base.faults is None:
            continue
        if r.faults >= max(2 * base.faults, base.faults + FAULTS_MORE):
            more.append(f"{r.workload} w={r.workers} {r.loader} {r.faults:.0f} (DataLoader {base.faults:.0f})")
    return ("page faults per sample (median): "
            + ("; ".join(more) if more else f"no loader above twice DataLoader's and {FAULTS_MORE} more"))


def _p(rows: Sequence[ZooRow], name: str) -> str:
    ps = sorted({r.processes for r in rows if r.loader == name and r.processes is not None})
    return ",".join(map(str, ps))


def _order(workload: str) -> int:
    names = [w.name for w in WORKLOADS]
    return names.index(workload) if workload in names else len(names)


def _rate(row: ZooRow) -> str:
    return "failed" if row.rate is None else f"{row.rate:.0f}"


def _ratio(row: ZooRow | None) -> str:
    if row is None or row.ratio is None:
        return "failed" if row is not None and row.rate is None else "-"
    return f"{row.ratio:.2f}x"


def target_lines(rows: Sequence[ZooRow]) -> list[str]:
    """Whether the zoo's targets hold: default >= 0.95x and processes >= 1.0x DataLoader on every workload."""
    out = []
    for name, goal in ((DEFAULT, 0.95), (PROCESSES, 1.0)):
        got = [r for r in rows if r.loader == name]
        if not got:
            continue
        worst = min(got, key=lambda r: r.ratio if r.ratio is not None else -1.0)
        misses = [r for r in got if r.ratio is None or r.ratio < goal]
        verdict = "met" if not misses else f"NOT met on {len(misses)} of {len(got)} cells"
        worst_text = "failed" if worst.ratio is None else f"{worst.ratio:.2f}x"
        line = (f"{name} >= {goal:.2f}x DataLoader on every cell: {verdict} "
                f"(worst {worst_text}: {worst.workload} at {worst.workers} workers)")
        spreads = [f"{r.workload} w={r.workers} {r.low:.2f}-{r.high:.2f}" for r in misses if r.low is not None]
        out.append(line + (f"; rounds' ratios of the cells missed: {', '.join(spreads)}" if spreads else ""))
    return out


def write_zoo_csv(rows: Sequence[ZooRow], path: Path) -> Path:
    """One CSV line per cell."""
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(ZooRow._fields)
        for r in rows:
            out.writerow([("" if v is None else round(v, 3) if isinstance(v, float) else v) for v in r])
    return path


def write_zoo_plot(rows: Sequence[ZooRow], path: Path, title: str) -> Path:
    """Bars of every loader's ratio to DataLoader per workload, one panel per worker count."""
    from matplotlib.figure import Figure

    workers = sorted({r.workers for r in rows})
    names = sorted({r.workload for r in rows}, key=_order)
    fig = Figure(figsize=(max(8, 1.3 * len(names)), 3.2 * len(workers)), layout="constrained")
    axes = fig.subplots(len(workers), 1, squeeze=False)[:, 0]
    width = 0.8 / (len(LOADERS) - 1)
    by_key = {(r.workload, r.workers, r.loader): r for r in rows}
    for ax, n in zip(axes, workers):
        for k, loader in enumerate(LOADERS[1:]):
            values = [(by_key.get((w, n, loader)) or ZooRow(w, n, loader, None, None, None)).ratio or 0.0 for w in names]
            xs = [i + (k - (len(LOADERS) - 2) / 2) * width for i in range(len(names))]
            ax.bar(xs, values, width, label=loader)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(0.95, color="grey", linewidth=0.8, linestyle="--")
        ax.set_xticks(range(len(names)), names, fontsize=8)
        ax.set_ylabel("x DataLoader")
        ax.set_title(f"{n} workers", fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=9)
    fig.savefig(path, dpi=100)
    return path


# ----------------------------------------------------------------------------- the run


def parse_workloads(text: str) -> list[str]:
    """argparse type: comma-separated zoo workload names.

    Raises:
        argparse.ArgumentTypeError: on an unknown or empty list.
    """
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = [w.name for w in WORKLOADS]
    unknown = [n for n in names if n not in known]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown workload(s) {', '.join(unknown) or repr(text)}; choose from {','.join(known)}")
    return names


def _selected(names: Sequence[str] | None) -> tuple[Workload, ...]:
    return tuple(w for w in WORKLOADS if w.name in names) if names else WORKLOADS


def run_zoo(args: argparse.Namespace) -> list[ZooRow]:
    """Run the zoo for the parsed bench flags; print the table and write ``zoo.txt``, ``zoo.csv`` and ``zoo.png``.

    Flags read: ``--workers`` (default 2,4), ``--worker-processes``, ``--rounds``,
    ``--quick`` / ``--smoke``, ``--cache-dir``, ``--out``, ``--no-progress``.

    Raises:
        BenchError: torchvision is missing or ``--out`` cannot be written.
    """
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    scale = SCALES[mode]
    workers = args.workers or [2, 4]
    rounds = getattr(args, "rounds", None) or _ROUNDS[mode]
    out = Path(args.out).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BenchError(f"--out {str(out)!r} is not writable ({e.strerror or e})") from None
    try:
        import_torchvision()
    except ImportError as e:
        raise BenchError(str(e)) from None
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    progress = not args.no_progress
    workloads = _selected(getattr(args, "zoo_workloads", None))
    if progress:
        print(f"zoo: {len(workloads)} workloads, workers {','.join(map(str, workers))}, {rounds} rounds, "
              f"{usable_cores()} cores", file=sys.stderr, flush=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        rows = measure_zoo(workloads, workers, scale, rounds=rounds, cache_dir=args.cache_dir,
                           processes=args.worker_processes, progress=progress)
        cost: TorchCallCost = torch_call_cost(calls=2_000 if args.smoke else 20_000, rounds=3 if args.smoke else 7)
    load_after = os.getloadavg() if hasattr(os, "getloadavg") else None
    title = (f"threadloader zoo ({mode}): {usable_cores()} cores, Python {platform.python_version()}, "
             f"torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    loads = (f"load average {load[0]:.2f} before, {load_after[0]:.2f} after"
             if load is not None and load_after is not None else "load average unknown")
    text = "\n".join([title, loads, "", format_zoo_table(rows), "", *target_lines(rows), cost.line(), ""])
    (out / "zoo.txt").write_text(text)
    write_zoo_csv(rows, out / "zoo.csv")
    write_zoo_plot(rows, out / "zoo.png", title)
    print(text)
    print(f"wrote {out / 'zoo.txt'}, {out / 'zoo.csv'}, {out / 'zoo.png'}")
    return rows
