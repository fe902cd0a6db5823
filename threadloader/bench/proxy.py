"""``python -m threadloader bench --proxy``: the GIL load of many cores, on a few.

On many cores each image costs its native work per core plus a little
GIL-held work. Images whose decode + resize costs 1/8 as much (112x149 JPEGs,
same quality and grain as the generated ImageNet-like set, resized to 67x67)
put the same GIL load per core on a small machine. So 2 workers on 2 cores
stand for 16 on 16, and 4 for 32.

Rows, measured in interleaved rounds (the best of each cell counts): threads,
DataLoader processes with the same kernel, and the kernel alone in
min(workers, cores) processes.

GIL hand-offs per image are counted with perf uprobes on the interpreter's
``take_gil``/``drop_gil`` (``tools/gil_probes.sh`` adds them): *releases* are
``drop_gil`` calls, *blocking* re-acquisitions are ``take_gil`` calls that
had to wait for another thread. Every thread of the process counts (the
consumer's too), over a window of whole batches, divided by its images.
Without the probes (no perf, no root, a free-threaded build) those columns
are empty and the note says why.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from threadloader.bench.data import image_files, prepare_dataset
from threadloader.bench.kernel_bound import kernel_bound_rate
from threadloader.bench.measure import measure
from threadloader.bench.pipelines import PROCESS_KERNEL, THREADS, build_loader
from threadloader.bench.usage import usable_cores

__all__ = ["FRAME_PATHS", "PROXY_IMAGE", "PROXY_SIZE", "GilCount", "count_gil", "gil_probes", "run_proxy"]

#: Source image size (height, width) and output side of the proxy: 1/8 the decode + resize cost.
PROXY_IMAGE = (112, 149)
PROXY_SIZE = 67
#: Generated proxy data set: classes, images per class.
_PROXY_DATA = (10, 100)
_EVENTS = ("tlgil:take", "tlgil:drop", "tlgil:wait")
#: Timed batches per cell and interleaved rounds (the best kept), by default. A cell then times
#: about half a second; the one-tenth-second cells of 30 batches swung by a factor of two.
_BATCHES, _ROUNDS = 200, 6


class GilCount(NamedTuple):
    """GIL hand-offs per image over a counting window."""

    releases: float  #: drop_gil calls per image
    blocking: float  #: take_gil calls that waited for another thread, per image
    images: int  #: images in the window


def gil_probes() -> str | None:
    """Why the GIL cannot be counted here, or None when the perf probes are in place."""
    if hasattr(sys, "_is_gil_enabled") and not sys._is_gil_enabled():
        return "no GIL on this build"
    perf = shutil.which("perf")
    if perf is None:
        return "no perf"
    try:
        listed = subprocess.run([perf, "probe", "-l"], check=False, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return f"perf probe -l failed ({e})"
    if not all(e in listed for e in _EVENTS):
        return "no GIL probes (run tools/gil_probes.sh as root)"
    return None


def _count_events(script: str, start: float, end: float) -> tuple[int, int]:
    """``(drops, blocking takes)`` in ``perf script -F tid,time,event`` output between two times."""
    drops = blocking = 0
    waiting: dict[str, bool] = {}  # tid -> whether its current take already counted as blocking
    for line in script.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        tid, stamp, event = parts[0], parts[1].rstrip(":"), parts[2].rstrip(":")
        try:
            t = float(stamp)
        except ValueError:
            continue
        if event == "tlgil:take":
            waiting[tid] = False
        if not start <= t <= end:
            continue
        if event == "tlgil:drop":
            drops += 1
        elif event == "tlgil:wait" and not waiting.get(tid, True):
            waiting[tid] = True
            blocking += 1
    return drops, blocking


def count_gil(loader: Any, batches: int, warmup: int) -> GilCount:
    """Iterate ``loader`` under perf and count GIL hand-offs per image.

    Raises:
        RuntimeError: perf failed to record.
    """
    it = iter(loader)
    for _ in range(warmup):
        next(it)
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "perf.data")
        cmd = ["perf", "record", "-q", "-k", "CLOCK_MONOTONIC", "-o", data, "-p", str(os.getpid())]
        for e in _EVENTS:
            cmd += ["-e", e]
        perf = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            time.sleep(1.0)  # attaching: the window starts after it
            start, images = time.clock_gettime(time.CLOCK_MONOTONIC), 0
            for _ in range(batches):
                images += int(next(it)[0].shape[0])
            end = time.clock_gettime(time.CLOCK_MONOTONIC)
        finally:
            perf.send_signal(signal.SIGINT)
            _, err = perf.communicate(timeout=60)
            del it
        if perf.returncode not in (0, -signal.SIGINT):
            raise RuntimeError(f"perf record failed: {err.decode(errors='replace').strip()[:200]}")
        script = subprocess.run(["perf", "script", "-i", data, "-F", "tid,time,event"], check=False, capture_output=True,
                                text=True, timeout=300).stdout
    drops, blocking = _count_events(script, start, end)
    return GilCount(drops / images, blocking / images, images)


def _rate(loader: str, root: Path, workers: int, batch_size: int, batches: int) -> float:
    warm = 2 * workers + 1  # the in-flight depth, and the start-up batch
    built = build_loader(loader, "batch", root, workers=workers, batch_size=batch_size, size=PROXY_SIZE,
                         num_samples=(warm + batches) * batch_size)
    return measure(built, max_items=warm + batches, warmup=warm).img_per_s


#: The frame paths the proxy compares: the pure-Python one, and the native call where it is built.
FRAME_PATHS = ("python", "native")


def _use_path(path: str) -> None:
    """Decode with ``path`` here, in forked workers and in spawned kernel-bound processes."""
    from threadloader.images import decode as image

    os.environ["THREADLOADER_NATIVE"] = "1" if path == "native" else "0"
    image._install_native()


def _paths() -> list[str]:
    from threadloader.images import decode as image

    saved = os.environ.get("THREADLOADER_NATIVE")
    os.environ["THREADLOADER_NATIVE"] = "1"
    try:
        return list(FRAME_PATHS) if image._bind_native() is not None else ["python"]
    finally:
        if saved is None:
            del os.environ["THREADLOADER_NATIVE"]
        else:
            os.environ["THREADLOADER_NATIVE"] = saved


def run_proxy(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Run the proxy and print its table; returns one row per frame path and worker count."""
    workers: Sequence[int] = args.workers or [2, 4]
    batch_size = args.batch_size or 32
    batches = args.max_batches or _BATCHES
    rounds = args.rounds or _ROUNDS
    cores = usable_cores()
    classes, per_class = _PROXY_DATA
    root = prepare_dataset(cache_dir=args.cache_dir, num_classes=classes, images_per_class=per_class,
                           progress=not args.no_progress, size=PROXY_IMAGE)
    files = image_files(root)
    paths = _paths()
    print(f"proxy data: {root} ({len(files)} images, {PROXY_IMAGE[0]}x{PROXY_IMAGE[1]} -> "
          f"{PROXY_SIZE}x{PROXY_SIZE}); batch {batch_size}, workers {','.join(map(str, workers))}, "
          f"{cores} cores, frame paths {','.join(paths)}, {rounds} interleaved rounds", flush=True)
    saved = os.environ.get("THREADLOADER_NATIVE")
    caught = warnings.catch_warnings()
    caught.__enter__()
    best: dict[tuple[str, str, int], float] = {}
    rows = []
    try:
        warnings.filterwarnings("ignore", message="This DataLoader will create")  # past the cores on purpose
        for _ in range(rounds):
            for path in paths:
                _use_path(path)
                for w in workers:
                    for name in (THREADS, PROCESS_KERNEL):
                        key = (path, name, w)
                        best[key] = max(best.get(key, 0.0), _rate(name, root, w, batch_size, batches))
                for k in sorted({min(w, cores) for w in workers}):
                    rate, _ = kernel_bound_rate(files, PROXY_SIZE, k, seconds=1.0, rounds=1)
                    best[path, "kernel", k] = max(best.get((path, "kernel", k), 0.0), rate)
        why = gil_probes()
        for path in paths:
            _use_path(path)
            for w in workers:
                gil = None
                if why is None:
                    loader = build_loader(THREADS, "batch", root, workers=w, batch_size=batch_size, size=PROXY_SIZE,
                                          num_samples=(2 * w + 1 + batches) * batch_size)
                    gil = count_gil(loader, batches, 2 * w + 1)
                threads, procs, bound = best[path, THREADS, w], best[path, PROCESS_KERNEL, w], best[
                    path, "kernel", min(w, cores)]
                rows.append({
                    "path": path, "workers": w, "threads img/s": threads, "DL+kernel img/s": procs,
                    "kernel bound img/s": bound, "threads/bound": threads / bound, "threads/DL+kernel": threads / procs,
                    "releases/img": gil.releases if gil else None, "blocking/img": gil.blocking if gil else None,
                })
    finally:
        caught.__exit__(None, None, None)
        if saved is None:
            os.environ.pop("THREADLOADER_NATIVE", None)
        else:
            os.environ["THREADLOADER_NATIVE"] = saved
        from threadloader.images import decode as image

        image._install_native()
    _print(rows, why)
    return rows


def _print(rows: list[dict[str, Any]], why: str | None) -> None:
    cols = list(rows[0])
    cells = [[c for c in cols]] + [
        ["-" if r[c] is None else f"{r[c]:.2f}" if isinstance(r[c], float) and c.endswith(("/bound", "kernel", "/img"))
         else f"{r[c]:.0f}" if isinstance(r[c], float) else str(r[c]) for c in cols]
        for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    for row in cells:
        print("  ".join(v.rjust(widths[i]) for i, v in enumerate(row)))
    print("GIL counts: perf uprobes on take_gil/drop_gil, every thread of the process, per image"
          + (f" (not counted: {why})" if why else ""))
