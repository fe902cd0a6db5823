"""The kernel bound: the frame kernel alone in k independent processes at once.

What k single-thread workers could reach with nothing but the per-image work
(decode + resize): no loader, no hand-offs, no shared address space. Each of k
spawned processes (one torch thread) runs the kernel for a few short rounds,
all starting together on a barrier; the best round counts.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.multiprocessing

from threadloader.bench.data import BenchError
from threadloader.bench.measure import error_line, make_row
from threadloader.bench.pipelines import CONFIGS, KERNEL_BOUND
from threadloader.bench.usage import usable_cores

__all__ = ["kernel_bound_rate", "kernel_bound_rows"]

log = logging.getLogger("threadloader.bench")


#: What a kernel-bound child reports when the start barrier broke under it (another child failed or was late).
_BARRIER_BROKEN = "barrier broken"


def _kernel_bound_child(
    rank: int, processes: int, files: Sequence[str], size: int, seconds: float, rounds: int,
    max_images: int | None, start_timeout: float, barrier: Any, results: Any, parent_pid: int,
) -> None:
    """One process of :func:`kernel_bound_rate`: warm up, then per round wait for the others and run the kernel.

    Reports exactly one ``(rank, [(images, start, end) per round], error)`` on
    ``results``; ``error`` is None, a one-line description of what failed, or
    ``_BARRIER_BROKEN``. A failing child reports before it breaks the barrier,
    so that the parent hears the cause before the others' echoes.
    """
    try:
        from threadloader.bench.pipelines import FrameLoader

        torch.set_num_threads(1)  # one core per process: the bound of k single-thread workers
        kernel = FrameLoader((size, size), eager=True)
        offset = rank * len(files) // processes  # each starts elsewhere, so the k do not read the same file
        kernel(files[offset % len(files)])  # first-call costs (imports, allocator) are not the kernel's
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it as one line
        results.put((rank, [], error_line(exc)))
        barrier.abort()
        return
    timed: list[tuple[int, float]] = []
    n = 0
    for _ in range(rounds):
        try:
            barrier.wait(start_timeout)  # all start each round together
        except threading.BrokenBarrierError:
            results.put((rank, [], _BARRIER_BROKEN))
            return
        try:
            # The machine-wide monotonic clock: the parent compares the processes' times.
            done, start = 0, _now()
            while (done == 0 or _now() - start < seconds) and (max_images is None or done < max_images):
                if os.getppid() != parent_pid:
                    return  # the parent is gone: nobody reads the result, and no orphan keeps running
                kernel(files[(offset + n) % len(files)])
                n += 1
                done += 1
            timed.append((done, start, _now()))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it as one line
            results.put((rank, [], error_line(exc)))
            barrier.abort()
            return
    results.put((rank, timed, None))


def kernel_bound_rate(
    files: Sequence[str | os.PathLike[str]],
    size: int,
    processes: int,
    *,
    seconds: float = 1.0,
    rounds: int = 3,
    max_images: int | None = None,
    start_timeout: float = 120.0,
) -> tuple[float, int]:
    """The frame kernel alone in ``processes`` independent processes at once: their joint rate.

    Each process (spawned, so it inherits no thread or OpenMP state) sets
    torch to one thread, builds ``FrameLoader((size, size), eager=True)``,
    warms up on one file, then, ``rounds`` times, waits until all are ready
    and decodes and resizes ``files`` (cycled, each from a different offset)
    for ``seconds`` (at least one image, at most ``max_images``). A round's
    rate is all the images its processes decoded over the time from the first
    start to the last end: what the hardware gives ``processes`` workers
    running nothing but the kernel, memory-bandwidth and cache contention
    included (and no more than the cores allow: processes that could not run
    at once do not add up). The best round counts: other work on the machine
    slows a round, never speeds it up.

    Args:
        files: image files.
        size: output side.
        processes: how many processes run at once.
        seconds: timed run per round.
        rounds: timed runs (the best one is kept).
        max_images: cap per process and round (None: time alone bounds it).
        start_timeout: seconds for all processes to start and warm up (and
            for each round's start).

    Returns:
        ``(img/s of the processes together, images they timed)`` of the best round.

    Raises:
        ValueError: ``processes`` or ``rounds`` below 1, or no files.
        BenchError: a process failed (its error, one line), died, or the
            processes did not all start in time. Every process is stopped and
            joined before this returns or raises, Ctrl-C included.
    """
    if processes < 1 or rounds < 1:
        raise ValueError(f"processes and rounds must be >= 1; got {processes} and {rounds}")
    if not files:
        raise ValueError("kernel_bound_rate needs at least one file")
    # spawn: a fresh interpreter per process, so no parent thread, lock or OpenMP pool is inherited.
    ctx = torch.multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes)
    results = ctx.Queue()
    paths = [os.fspath(f) for f in files]
    procs = [
        ctx.Process(
            target=_kernel_bound_child, name=f"threadloader-kernel-bound-{rank}", daemon=True,
            args=(rank, processes, paths, size, seconds, rounds, max_images, start_timeout, barrier, results,
                  os.getpid()),
        )
        for rank in range(processes)
    ]
    what = f"kernel bound ({processes} process{'es' if processes > 1 else ''})"
    done: dict[int, list[tuple[int, float]]] = {}
    broken: set[int] = set()
    try:
        for p in procs:
            p.start()
        # Start-up, warm-up and the runs; past this something is stuck (each barrier wait times out sooner).
        limit = start_timeout + rounds * (seconds + start_timeout) + 60.0
        deadline = time.monotonic() + limit
        while len(done) + len(broken) < processes:
            try:
                rank, timed, error = results.get(timeout=0.2)
            except queue.Empty:
                silent = [p for r, p in enumerate(procs) if r not in done and r not in broken and p.exitcode is not None]
                if silent:
                    p = silent[0]
                    raise BenchError(f"{what}: {p.name} exited with code {p.exitcode} without a result") from None
                if time.monotonic() > deadline:
                    raise BenchError(f"{what}: no result after {limit:.0f} s") from None
                continue
            if error == _BARRIER_BROKEN:
                broken.add(rank)  # an echo: the cause (a failed or late process) reports on its own
            elif error is not None:
                raise BenchError(f"{what}: process {rank} failed: {error}")
            else:
                done[rank] = timed
        if broken:
            raise BenchError(f"{what}: the processes did not all start and warm up within {start_timeout:g} s")
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            if p.pid is not None:  # started
                p.join(10.0)
                if p.is_alive():
                    p.kill()
                    p.join()
        results.close()
        results.join_thread()
    return max(_round_rate([t[i] for t in done.values()]) for i in range(rounds))


def _now() -> float:
    """CLOCK_MONOTONIC: one clock for every process on the machine."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def _round_rate(timed: list[tuple[int, float, float]]) -> tuple[float, int]:
    """``(img/s, images)`` of one round: every process's images over the span from the first start to the last end.

    Not the sum of each process's own rate: processes that did not overlap
    (short runs, fewer cores than processes) would add up to more than the
    machine did.
    """
    images = sum(done for done, _, _ in timed)
    span = max(end for _, _, end in timed) - min(start for _, start, _ in timed)
    return (images / span if span > 0 else 0.0), images


def kernel_bound_rows(
    configs: Sequence[str], workers: Sequence[int], rates: dict[int, tuple[float, int]], cores: int | None = None,
    baselines: dict[tuple[str, int], float | None] | None = None,
    errors: dict[int, str] | None = None,
) -> list[dict[str, Any]]:
    """The kernel bound per (config, workers), measured with k = min(workers, cores) processes.

    Args:
        configs: keys of ``CONFIGS``.
        workers: worker counts.
        rates: k -> ``(img/s, images timed)`` from :func:`kernel_bound_rate`
            with k processes; one measurement serves every worker count with
            the same k.
        cores: the core count (default: the cores this process may use).
        baselines: (config label, workers) -> DataLoader's img/s, for ``ratio``.
        errors: k -> why the measurement with k processes failed; such rows
            get no rate and say why in ``note``.

    Returns:
        One row per config and worker count (``images``: the images the
        measurement timed, all processes together, in its best round).
    """
    cores = cores or usable_cores()
    rows = []
    for config in configs:
        for w in workers:
            k = min(w, cores)
            baseline = (baselines or {}).get((CONFIGS[config], w))
            if k not in rates:
                note = f"failed: {(errors or {}).get(k, f'not measured with {k} processes')}"[:200]
                rows.append(make_row(CONFIGS[config], w, KERNEL_BOUND, None, note=note, baseline=baseline))
                continue
            rate, images = rates[k]
            row = make_row(
                CONFIGS[config], w, KERNEL_BOUND, None, img_per_s=rate, baseline=baseline,
                note=f"measured: {k} independent process{'es' if k > 1 else ''}, 1 thread each, kernel alone",
            )
            row["images"] = images
            rows.append(row)
    return rows
