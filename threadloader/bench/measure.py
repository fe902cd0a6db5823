"""Timing loaders: one cell (loader, config, workers) at a time, and the comparison over worker counts.

The kernel bound is in :mod:`.kernel_bound`, the Python time per image in :mod:`.python_time`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from threadloader.bench.pipelines import (
    BASELINE,
    CONFIGS,
    LOADERS,
    THREADS_IN_PROCESSES,
    build_loader,
    worker_processes_for,
)
from threadloader.bench.usage import usage

__all__ = [
    "Measurement",
    "compare_loaders",
    "count_images",
    "error_line",
    "make_row",
    "measure",
    "run_comparison",
]

log = logging.getLogger("threadloader.bench")


@dataclasses.dataclass
class Measurement:
    """Result of :func:`measure`.

    ``images`` and ``seconds`` cover the timed part only (after warm-up);
    ``timed_items`` is how many items (samples or batches) it held and
    ``complete`` whether that reached the minimum asked for: a run whose timed
    part is shorter than that has no rate.
    """

    images: int
    seconds: float
    first_batch_s: float
    timed_items: int = 0
    complete: bool = True
    #: CPU seconds and page faults (minor + major) of the timed part, this
    #: process and its worker processes together (see :mod:`.usage`); None
    #: where /proc cannot tell.
    cpu_s: float | None = None
    page_faults: int | None = None
    #: The most ``cpu_s`` may be off by (clock ticks where a process's CPU
    #: clock could not be read; see :class:`.usage.Usage`).
    cpu_resolution_s: float = 0.0

    @property
    def cores(self) -> float | None:
        """CPU cores kept busy on average during the timed part; None when the CPU time cannot resolve it.

        A window shorter than 20 times the CPU time's resolution (0.05 cores)
        has no figure: read in clock ticks, a short window can show more cores
        than the machine has.
        """
        if self.cpu_s is None or self.seconds <= 0 or self.cpu_resolution_s > 0.05 * self.seconds:
            return None
        return self.cpu_s / self.seconds

    @property
    def img_per_s(self) -> float:
        if not self.complete or self.seconds <= 0:
            return float("nan")
        return self.images / self.seconds


def count_images(item: Any) -> int:
    """Images in one loader item: ``N`` of a 4-D tensor (first element of a tuple/list/dict), else 1."""
    if isinstance(item, (tuple, list)) and item:
        item = item[0]
    elif isinstance(item, dict) and item:
        item = next(iter(item.values()))
    if isinstance(item, torch.Tensor) and item.dim() == 4:
        return int(item.shape[0])
    return 1


def _sync() -> None:
    # Asynchronous device work belongs to the batch: wait for it before the clock stops.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def measure(
    loader: Iterable[Any],
    *,
    max_items: int | None = None,
    warmup: int = 1,
    min_timed: int = 1,
    counter: Callable[[Any], int] = count_images,
) -> Measurement:
    """Iterate ``loader`` and time it after ``warmup`` items.

    Args:
        loader: any iterable of samples or batches.
        max_items: stop after this many items, warm-up included (None: one epoch).
        warmup: items at the start that are not timed (start-up cost).
        min_timed: fewest timed items for a rate (one batch); fewer gives
            ``complete=False`` and no rate.
        counter: images per item.

    Returns:
        A :class:`Measurement`.
    """
    start = time.perf_counter()
    first = None
    warm_start = start if warmup <= 0 else None
    warm_images = items = 0
    it = iter(loader)
    used_start = usage() if warmup <= 0 else None
    try:
        for item in it:
            items += 1
            n = counter(item)
            if first is None:
                _sync()
                first = time.perf_counter() - start
            if items == warmup:
                _sync()
                # The clock starts first: whatever the workers make while
                # /proc is read is the timed part's (read after the clock,
                # it would be produced off the clock and consumed for free).
                warm_start = time.perf_counter()
                used_start = usage()
            elif items > warmup:
                warm_images += n
            if max_items is not None and items >= max_items:
                break
        _sync()
        end = time.perf_counter()
        used_end = usage()
    finally:
        # Ends the epoch now (joins threads / stops processes) rather than at GC.
        close = getattr(it, "close", None) or getattr(it, "_shutdown_workers", None)
        del it
        if close is not None:
            close()
    timed = max(items - max(warmup, 0), 0)
    seconds = end - warm_start if warm_start is not None else 0.0
    used = used_end - used_start if used_start is not None and used_end is not None else None
    return Measurement(warm_images, seconds, first or 0.0, timed, timed >= max(min_timed, 1),
                       used.cpu_s if used else None, used.faults if used else None,
                       used.resolution_s if used else 0.0)


def make_row(
    config: str, workers: int, loader: str, m: Measurement | None, *, note: str = "",
    baseline: float | None = None, img_per_s: float | None = None,
) -> dict[str, Any]:
    """One result row (the keys of ``report.COLUMNS``).

    ``img/s`` is None when the measurement is incomplete or missing (never a
    made-up rate); ``ratio`` is ``img/s / baseline`` when both are known.
    """
    rate = img_per_s if img_per_s is not None else (m.img_per_s if m is not None else float("nan"))
    rate_or_none = None if rate != rate else round(rate, 1)  # NaN: no rate
    if m is not None and not m.complete:
        short = f"too short: {m.timed_items} items timed after warm-up, under one batch"
        note = f"{note}; {short}" if note else short
    return {
        "config": config,
        "workers": workers,
        "loader": loader,
        "img/s": rate_or_none,
        "first_batch_s": round(m.first_batch_s, 3) if m is not None and m.first_batch_s else None,
        "images": m.images if m is not None else None,
        "cores": round(m.cores, 1) if m is not None and m.cores is not None else None,
        "faults/img": (round(m.page_faults / m.images, 1)
                       if m is not None and m.page_faults is not None and m.images else None),
        "ratio": round(rate_or_none / baseline, 2) if rate_or_none and baseline else None,
        "note": note,
    }


def in_flight_depth(workers: int, prefetch_factor: int = 2) -> int:
    """Items (batches, or samples unbatched) a loader with ``workers`` produces ahead of its consumer."""
    return prefetch_factor * workers


def run_comparison(
    root: str | os.PathLike[str],
    *,
    configs: Sequence[str],
    workers: Sequence[int],
    batch_size: int = 32,
    max_batches: int = 20,
    warmup_batches: int = 1,
    size: int | tuple[int, int] = 224,
    device: str = "cuda",
    loaders: Sequence[str] = LOADERS,
    progress: bool = True,
    worker_processes: int | None = None,
    is_valid_file: Callable[[str], bool] | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    on_error: Callable[[BaseException, str, int, str], str] | None = None,
) -> list[dict[str, Any]]:
    """Measure every (config, workers, loader) cell, baseline first in each group.

    Args:
        root: ImageFolder-style root.
        configs: keys of ``CONFIGS`` (``gpu`` is dropped without CUDA).
        workers: worker counts.
        batch_size: images per batch.
        max_batches: timed-run length in batches (per-sample configs use
            ``max_batches * batch_size`` samples).
        warmup_batches: batches (or ``batch_size`` samples) not timed; at
            least :func:`in_flight_depth` items are always left untimed.
        size: output image size.
        device: the GPU device for the ``gpu`` config.
        loaders: which loaders to run (``pipelines.ALL_LOADERS`` for all).
        progress: show a tqdm bar on stderr.
        worker_processes: P for the threads-in-processes loader.
        is_valid_file: ImageFolder's file filter.
        on_row: called with each row as soon as it is measured (e.g. to
            append it to a CSV, so that an interruption keeps it).
        on_error: ``f(exc, config, workers, loader)`` for a cell that raised:
            returns the note of a row without a rate, or raises to stop the
            run. Without it the exception propagates.

    Returns:
        One row per cell (see :func:`make_row`); ``ratio`` is img/s over the
        ``DataLoader`` row of the same config and workers.
    """
    from threadloader.bench.report import progress_bar

    configs = [c for c in configs if c != "gpu" or torch.cuda.is_available()]
    order = sorted(loaders, key=lambda name: name != BASELINE)  # the ratio's denominator first
    cells = [(c, w, name) for c in configs for w in workers for name in order]
    rows: list[dict[str, Any]] = []
    with progress_bar(len(cells), progress, desc="measuring", unit="run") as bar:
        baseline: dict[tuple[str, int], float | None] = {}
        for config, w, name in cells:
            bar.set_description(f"{CONFIGS[config]} w={w} {name}")
            per = 1 if config != "resize" else batch_size
            # Items produced ahead during warm-up would be timed as if free:
            # skip at least what a loader keeps in flight (DataLoader's
            # prefetch_factor 2 per worker) before the clock starts.
            warm = max(warmup_batches * per, in_flight_depth(w))
            try:
                items = max_batches * per + warm
                loader = build_loader(
                    name, config, root, workers=w, batch_size=batch_size, size=size, device=device,
                    worker_processes=worker_processes, is_valid_file=is_valid_file,
                    # as many samples as the run times, cycling over a small folder
                    num_samples=items * (batch_size if config != "resize" else 1),
                )
                m = measure(loader, max_items=items, warmup=warm, min_timed=per)
                # The P that ran (at most one process per worker), whatever was asked.
                note = f"P={worker_processes_for(w, worker_processes)}" if name == THREADS_IN_PROCESSES else ""
                row = make_row(CONFIGS[config], w, name, m, baseline=baseline.get((config, w)), note=note)
            except Exception as exc:  # noqa: BLE001 - handed to on_error, which decides
                if on_error is None:
                    raise
                row = make_row(CONFIGS[config], w, name, None, note=on_error(exc, config, w, name))
            if name == BASELINE:
                baseline[(config, w)] = row["img/s"]
            log.info("measured %s", row)
            rows.append(row)
            if on_row is not None:
                on_row(row)
            bar.set_postfix_str(f"{row['img/s']:.0f} img/s" if row["img/s"] else "no rate")
            bar.update(1)
    return rows


def error_line(exc: BaseException) -> str:
    """``"TypeName: first line of the message"`` (just the type name when the message is empty)."""
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def compare_loaders(
    factories: dict[str, Callable[[int], Iterable[Any]]],
    workers: Sequence[int],
    *,
    max_items: int | None,
    warmup: int = 1,
    config: str = "",
    progress: bool = False,
    baseline: str = "DataLoader",
) -> list[dict[str, Any]]:
    """Measure named loaders over worker counts (what the examples print).

    Args:
        factories: name -> ``f(workers)`` building a fresh iterable.
        workers: worker counts.
        max_items: items (samples or batches) per timed run, warmup included.
        warmup: items not timed.
        config: label for the ``config`` column.
        progress: show a tqdm bar on stderr.
        baseline: the name whose img/s is the denominator of ``ratio``.

    Returns:
        Rows with the keys of ``report.COLUMNS``.
    """
    from threadloader.bench.report import progress_bar

    rows: list[dict[str, Any]] = []
    names = sorted(factories, key=lambda name: name != baseline)
    with progress_bar(len(factories) * len(workers), progress, desc=config, unit="run") as bar:
        for w in workers:
            base = None
            for name in names:
                bar.set_description(f"{config} w={w} {name}")
                m = measure(factories[name](w), max_items=max_items, warmup=warmup)
                rows.append(make_row(config, w, name, m, baseline=base))
                if name == baseline:
                    base = rows[-1]["img/s"]
                log.info("measured %s", rows[-1])
                bar.update(1)
    # Keep the caller's loader order within each worker count.
    order = {name: i for i, name in enumerate(factories)}
    rows.sort(key=lambda r: (workers.index(r["workers"]), order[r["loader"]]))
    return rows
