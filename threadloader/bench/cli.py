"""``python -m threadloader bench``: flags (validated at parse time), checks of input and output, the run.

Expected problems -- a bad flag, a missing or empty ``--root``, a bad image in
it, an ``--out`` that cannot be written, ``--configs gpu`` without CUDA --
end the run with one line on stderr and a non-zero exit status, never a
traceback, and never replace the previous run's ``bench.log``.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import time
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from threadloader.bench.data import (
    AllowedFiles,
    BenchError,
    find_bad_files,
    image_files,
    prepare_dataset,
)
from threadloader.bench.kernel_bound import kernel_bound_rate, kernel_bound_rows
from threadloader.bench.measure import error_line, run_comparison
from threadloader.bench.pipelines import (
    ALL_LOADERS,
    BASELINE,
    CONFIGS,
    THREADS_IN_PROCESSES,
    import_torchvision,
    supports_worker_processes,
)
from threadloader.bench.python_time import python_time_per_image
from threadloader.bench.report import (
    COLUMNS,
    CsvRows,
    bound_notes,
    format_python_time,
    format_table,
    run_metadata,
    summarize,
    write_plot,
)
from threadloader.bench.usage import usable_cores

__all__ = [
    "PROG",
    "add_arguments",
    "add_example_arguments",
    "bench_workers",
    "build_parser",
    "default_workers",
    "example_data",
    "main",
    "non_negative_int",
    "parse_configs",
    "parse_workers",
    "positive_int",
    "run",
    "run_cli",
]

PROG = "python -m threadloader bench"

#: Generated data set per mode: (classes, images per class, make_imagenet_like kwargs).
_DATA: dict[str, tuple[int, int, dict[str, Any]]] = {
    "full": (10, 100, {}),
    "quick": (4, 48, {}),
    "smoke": (2, 8, {"size": (96, 128)}),
}
#: Largest accepted ``--size`` (a 4096x4096 RGB batch of 32 is already 1.6 GB).
MAX_SIZE = 4096

log = logging.getLogger("threadloader.bench")


# ----------------------------------------------------------------------------- flag types


def _int_at_least(text: str, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}; got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be {what}; got {text!r}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _int_at_least(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_at_least(text, 0, "an integer >= 0")


def image_side(text: str) -> int:
    """argparse type: an output image side, 1..MAX_SIZE."""
    value = positive_int(text)
    if value > MAX_SIZE:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_SIZE}; got {text!r}")
    return value


#: The most workers per usable core ``--workers`` accepts (the main job goes to 2).
MAX_WORKERS_PER_CORE = 16


def parse_workers(text: str) -> list[int]:
    """Parse ``"1,2,4"`` into ``[1, 2, 4]`` (sorted, duplicates dropped).

    Raises:
        argparse.ArgumentTypeError: on anything but positive integers, or more than
            :data:`MAX_WORKERS_PER_CORE` per usable core.
    """
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"workers must look like 1,2,4; got {text!r}") from exc
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"workers must be positive integers; got {text!r}")
    cores = usable_cores()
    cap = MAX_WORKERS_PER_CORE * cores
    if max(values) > cap:
        # Each DataLoader worker is a process of a few hundred MB: far past
        # the cores, a typo would run the machine out of memory.
        raise argparse.ArgumentTypeError(
            f"workers must be at most {cap} ({MAX_WORKERS_PER_CORE} x the {cores} usable cores); got {text!r}"
        )
    return sorted(set(values))


def parse_configs(text: str) -> list[str]:
    """Parse ``"batch,normalize"`` into config keys, in :data:`CONFIGS` order.

    Raises:
        argparse.ArgumentTypeError: on an unknown or empty list.
    """
    names = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in names if c not in CONFIGS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown config(s) {', '.join(unknown) or repr(text)}; choose from {','.join(CONFIGS)}"
        )
    return [c for c in CONFIGS if c in names]


def parse_device(text: str) -> str:
    """argparse type: anything ``torch.device`` accepts."""
    try:
        torch.device(text)
    except (RuntimeError, ValueError) as e:
        raise argparse.ArgumentTypeError(f"not a torch device: {text!r} ({e})") from None
    return text


def default_workers(cap: int | None = None) -> list[int]:
    """1, 2, 4, 8, 16 capped at the number of cores (always including the cap); the examples' default."""
    cores = cap or usable_cores()
    values = [w for w in (1, 2, 4, 8, 16) if w <= cores]
    if cores <= 16 and cores not in values:
        values.append(cores)
    return values


def bench_workers(cores: int | None = None) -> list[int]:
    """The main job's worker counts: powers of two up to twice the cores, plus the cores and twice them.

    Past the core count, threads show whether they still gain (I/O waits) and
    processes what oversubscription costs them.
    """
    cores = cores or usable_cores()
    values = {1 << k for k in range((2 * cores).bit_length()) if 1 << k <= 2 * cores}
    return sorted(values | {cores, 2 * cores})


# ----------------------------------------------------------------------------- parser


def _zoo_workloads(text: str) -> list[str]:
    from threadloader.bench.zoo import parse_workloads

    return parse_workloads(text)


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the bench flags to ``parser`` (shared by ``python -m threadloader bench``)."""
    parser.add_argument("--root", help="your own ImageFolder-style folder, root/<class>/<image> (default: generated data)")
    parser.add_argument("--cache-dir", help="where generated data lives (default: $THREADLOADER_CACHE or ~/.cache/threadloader)")
    parser.add_argument("--workers", type=parse_workers, help="worker counts, e.g. 1,2,4 (default: powers of two up to twice the cores)")
    parser.add_argument("--batch-size", type=positive_int, default=None, help="images per batch (default 32)")
    parser.add_argument("--max-batches", type=positive_int, default=None, help="timed batches per run (default 20)")
    parser.add_argument("--warmup", type=non_negative_int, default=1, help="batches not timed at the start of each run, and never fewer than the in-flight depth, 2 x workers (default 1)")
    parser.add_argument("--size", type=image_side, default=None, help="output image side (default 224; 64 with --smoke)")
    parser.add_argument("--configs", type=parse_configs, default=None,
                        help=f"comma-separated subset of {','.join(CONFIGS)} (default: all; gpu needs CUDA)")
    parser.add_argument("--device", type=parse_device, default="cuda", help="device of the gpu config (default cuda)")
    parser.add_argument("--worker-processes", type=positive_int, default=None,
                        help="P for the 'ThreadDataLoader, processes' rows (default: workers // 4, at least 1; never more than a row's workers)")
    parser.add_argument("--skip-bad-files", action="store_true",
                        help="check every image first and leave out unreadable ones (as ImageFolder's is_valid_file)")
    parser.add_argument("--out", default="bench-out", help="output folder for table, CSV, PNG and log (default ./bench-out)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small run, about a minute on 2 cores")
    mode.add_argument("--smoke", action="store_true", help="tiny run for tests (seconds)")
    mode.add_argument("--proxy", action="store_true",
                      help="many cores' GIL load on a few: 1/8-cost images, threads vs processes vs the kernel "
                           "alone, with GIL hand-offs per image (threadloader/bench/proxy.py)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--zoo", action="store_true",
                        help="the workload zoo instead: DataLoader against ThreadDataLoader's modes on common workloads "
                             "(workers default 2,4; writes zoo.txt, zoo.csv, zoo.png)")
    parser.add_argument("--zoo-workloads", type=_zoo_workloads, default=None,
                        help="zoo only: comma-separated subset of the workloads (default: all)")
    parser.add_argument("--rounds", type=positive_int, default=None,
                        help="zoo and proxy: interleaved rounds (zoo: per cell, the median ratio kept, default 4, 3 "
                             "with --quick, 1 with --smoke; proxy: the best kept, default 6)")
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The stand-alone parser of :func:`main`."""
    import threadloader.bench as package

    parser = argparse.ArgumentParser(
        prog=PROG, description=package.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    return add_arguments(parser)


def add_example_arguments(
    parser: argparse.ArgumentParser, *, batch_size: int = 32, max_batches: int = 10
) -> argparse.ArgumentParser:
    """Flags shared by the scripts in ``examples/``: data, workers, sizes, ``--smoke``."""
    parser.add_argument("--root", help="your own ImageFolder-style folder (default: generated data)")
    parser.add_argument("--cache-dir", help="where generated data lives (default: $THREADLOADER_CACHE or ~/.cache/threadloader)")
    parser.add_argument("--workers", type=parse_workers, help="worker counts, e.g. 1,2,4 (default: 1,2,4,8,16 capped at the cores)")
    parser.add_argument("--batch-size", type=positive_int, default=batch_size, help=f"images per batch (default {batch_size})")
    parser.add_argument("--max-batches", type=positive_int, default=max_batches, help=f"timed batches per run (default {max_batches})")
    parser.add_argument("--smoke", action="store_true", help="tiny generated data, a few seconds")
    return parser


def example_data(args: argparse.Namespace) -> tuple[Path, list[int], int, int, int]:
    """Resolve the shared example flags.

    Returns:
        ``(root, workers, batch_size, max_batches, size)``; with ``--smoke``:
        tiny generated images, batches of 4, 2 batches, workers 1,2, size 64.
    """
    mode = "smoke" if args.smoke else "quick"
    classes, per_class, extra = _DATA[mode]
    root = prepare_dataset(
        args.root, cache_dir=args.cache_dir, num_classes=classes, images_per_class=per_class, **extra
    )
    if args.smoke:
        return root, args.workers or [1, 2], min(args.batch_size, 4), min(args.max_batches, 2), 64
    return root, args.workers or default_workers(), args.batch_size, args.max_batches, 224


# ----------------------------------------------------------------------------- checks


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    defaults = {
        "full": dict(batch_size=32, max_batches=20, workers=bench_workers(), size=224),
        "quick": dict(batch_size=32, max_batches=5, workers=[1, 2], size=224),
        "smoke": dict(batch_size=4, max_batches=2, workers=[1, 2], size=64),
    }[mode]
    explicit = args.configs is not None
    configs = args.configs if explicit else list(CONFIGS)
    if "gpu" in configs and not torch.cuda.is_available():
        if explicit:
            raise BenchError("--configs gpu needs CUDA, and torch.cuda.is_available() is False here; drop gpu")
        configs = [c for c in configs if c != "gpu"]
    return {
        "mode": mode,
        "batch_size": args.batch_size or defaults["batch_size"],
        "max_batches": args.max_batches or defaults["max_batches"],
        "warmup": args.warmup,
        "workers": args.workers or defaults["workers"],
        "configs": configs,
        "size": args.size or defaults["size"],
    }


def _check_out(out: Path) -> None:
    """Create ``out`` or say in one line why it cannot hold the results."""
    if out.exists() and not out.is_dir():
        raise BenchError(f"--out {str(out)!r} is a file; give a folder for the results")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise BenchError(f"--out {str(out)!r} is not writable ({e.strerror or e})") from None


def _data(args: argparse.Namespace, s: dict[str, Any]) -> tuple[Path, list[Path]]:
    """The data root and its image files, generated when no ``--root`` is given."""
    if args.root is not None:
        root = Path(args.root).expanduser()
        if not root.is_dir():
            raise BenchError(f"--root {str(root)!r} is not a folder")
        files = image_files(root)
        if not files:
            raise BenchError(
                f"--root {str(root)!r} holds no images: expected the ImageFolder layout root/<class>/<image>.jpg"
            )
        return root, files
    classes, per_class, extra = _DATA[s["mode"]]
    root = prepare_dataset(
        cache_dir=args.cache_dir, num_classes=classes, images_per_class=per_class,
        progress=not args.no_progress, **extra,
    )
    return root, image_files(root)


def _skip_bad(files: list[Path], progress: bool) -> tuple[list[Path], AllowedFiles]:
    bad = find_bad_files(files, progress=progress)
    for path, reason in bad[:10]:
        print(f"skipping {path}: {reason}", file=sys.stderr)
    if len(bad) > 10:
        print(f"skipping {len(bad) - 10} more unreadable files (all listed in bench.log)", file=sys.stderr)
    for path, reason in bad:
        log.warning("skipped %s: %s", path, reason)
    good = [f for f in files if f not in {p for p, _ in bad}]
    return good, AllowedFiles(good)


def _check_classes(root: Path, files: list[Path]) -> None:
    """Every class folder keeps a usable image: ImageFolder refuses a class without one."""
    used = {f.relative_to(root).parts[0] for f in files}
    empty = [p.name for p in sorted(root.iterdir()) if p.is_dir() and p.name not in used]
    if empty:
        more = f" (and {len(empty) - 1} more)" if len(empty) > 1 else ""
        raise BenchError(
            f"{str(root)!r}: class folder {empty[0]!r}{more} holds no usable image; ImageFolder needs at least one "
            f"per class: add images or remove the folder"
        )


def _check_enough(root: Path, images: int, s: dict[str, Any]) -> None:
    need = (s["warmup"] + 1) * s["batch_size"]
    if images < need:
        raise BenchError(
            f"{str(root)!r} has {images} usable images; the bench needs at least (--warmup {s['warmup']} + 1 timed "
            f"batch) x --batch-size {s['batch_size']} = {need}: lower --batch-size or --warmup, or add images"
        )


class _BadFiles:
    """Scans the data, once and only after something failed, for an image that cannot be read."""

    def __init__(self, files: list[Path]) -> None:
        self._files = files
        self._scanned: list[tuple[Path, str]] | None = None

    def check(self) -> None:
        """Raise the one-line :class:`BenchError` naming a bad image, if the data has one."""
        if self._scanned is None:
            self._scanned = find_bad_files(self._files)
        if self._scanned:
            path, reason = self._scanned[0]
            more = f" (and {len(self._scanned) - 1} more)" if len(self._scanned) > 1 else ""
            raise BenchError(
                f"bad image file {path}: {reason}{more}; rerun with --skip-bad-files to leave unreadable files out"
            ) from None


def _log_failure(what: str, exc: BaseException) -> None:
    log.error("%s failed:\n%s", what, "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))


def _on_error(bad: _BadFiles) -> Any:
    """The cell-error policy: a bad image ends the run naming the file; anything else marks the row."""

    def handle(exc: BaseException, config: str, workers: int, loader: str) -> str:
        _log_failure(f"{config} w={workers} {loader}", exc)
        bad.check()
        return f"failed: {error_line(exc)}"[:200]

    return handle


# ----------------------------------------------------------------------------- the run


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Run the bench for parsed ``args``; print the table and write CSV, PNG, text and log.

    The log goes to ``bench.log`` only when the run completes; a failed or
    interrupted run leaves ``bench-failed.log`` and the previous ``bench.log``
    untouched. Rows reach ``results.csv`` as they are measured; the previous
    run's ``results.txt`` and ``throughput.png`` are removed when measuring
    starts, so a failed run never leaves them beside its own rows.

    Returns:
        The result rows (see :func:`threadloader.bench.measure.run_comparison`),
        kernel-bound rows included.

    Raises:
        BenchError: an expected problem, told in one line.
        KeyboardInterrupt: after keeping the rows measured so far.
    """
    s = _settings(args)
    out = Path(args.out).expanduser()
    _check_out(out)
    partial = out / f".bench-{os.getpid()}.log"
    handler = logging.FileHandler(partial, mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    done = False
    cores = usable_cores()  # the CPU affinity, read once: header, log and kernel bound agree
    csv_rows: CsvRows | None = None
    try:
        log.info(
            "threadloader bench: mode=%s python=%s torch=%s cpus=%s cuda=%s platform=%s argv=%s",
            s["mode"], platform.python_version(), torch.__version__, f"{cores} usable of {os.cpu_count()}",
            torch.cuda.is_available(), platform.platform(), vars(args),
        )
        t0 = time.perf_counter()
        root, files = _data(args, s)
        allowed = None
        found = len(files)
        if args.skip_bad_files:
            files, allowed = _skip_bad(files, not args.no_progress)
        _check_classes(root, files)
        _check_enough(root, len(files), s)
        bad = _BadFiles(files)
        import_torchvision_or_fail()
        log.info("data root %s (%d images) ready in %.1f s; settings %s", root, len(files), time.perf_counter() - t0, s)
        loaders = [name for name in ALL_LOADERS if name != THREADS_IN_PROCESSES or supports_worker_processes()]
        if THREADS_IN_PROCESSES not in loaders:
            log.info("ThreadDataLoader has no worker_processes here: no '%s' rows", THREADS_IN_PROCESSES)
        elif (note := _capped_processes_note(s["workers"], args.worker_processes)) is not None:
            log.info("%s", note)
            print(f"{PROG}: note: {note}", file=sys.stderr)
        print(f"data: {root} ({_image_count(found, len(files))}); batch {s['batch_size']}, {s['size']}x{s['size']}, "
              f"workers {','.join(map(str, s['workers']))}, {cores} cores", flush=True)
        # A new results.csv starts here: the old run's table and plot would
        # sit beside it as if they were this run's, should it fail.
        for stale in ("results.txt", "throughput.png"):
            (out / stale).unlink(missing_ok=True)
        csv_rows = CsvRows(out / "results.csv")
        rows: list[dict[str, Any]] = []
        with warnings.catch_warnings():
            # DataLoader's "suggested max number of worker" warning, once per cell past the
            # core count, is expected here: the bench goes to twice the cores on purpose.
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            try:
                def keep(row: dict[str, Any]) -> None:
                    rows.append(row)
                    csv_rows(row)

                run_comparison(
                    root, configs=s["configs"], workers=s["workers"], batch_size=s["batch_size"],
                    max_batches=s["max_batches"], warmup_batches=s["warmup"], size=s["size"], device=args.device,
                    loaders=loaders, progress=not args.no_progress, worker_processes=args.worker_processes,
                    is_valid_file=allowed, on_row=keep, on_error=_on_error(bad),
                )
            except KeyboardInterrupt:
                print(f"\ninterrupted: the {len(rows)} rows measured so far are in {out / 'results.csv'}",
                      file=sys.stderr)
                if rows:
                    print(format_table(rows, COLUMNS))
                raise
        rates, errors = _kernel_bounds(files, s, cores, bad)
        baselines = {(r["config"], r["workers"]): r["img/s"] for r in rows if r["loader"] == BASELINE}
        for row in kernel_bound_rows(s["configs"], s["workers"], rates, cores, baselines=baselines, errors=errors):
            rows.append(row)
            csv_rows(row)
            log.info("kernel bound %s", row)
        try:
            python_time = python_time_per_image(
                root, files, size=s["size"], batch_size=s["batch_size"], images=max(4 * s["batch_size"], 128),
                is_valid_file=allowed,
            )
        except Exception as e:
            # It reads files the timed cells may not have reached.
            _log_failure("the Python time per image", e)
            bad.check()
            raise
        csv_rows.close()
        written = _report(rows, python_time, out, s, args.device, root)
        done = True
        for path in written:
            print(f"  {path}")
        return rows
    except BenchError as e:
        log.error("%s", e)
        raise
    except KeyboardInterrupt:
        log.error("interrupted (Ctrl-C)")
        raise
    finally:
        if csv_rows is not None:
            csv_rows.close()
        log.removeHandler(handler)
        handler.close()
        os.replace(partial, out / ("bench.log" if done else "bench-failed.log"))


def _image_count(found: int, used: int) -> str:
    """``"10 images"``, or ``"10 images, 2 unreadable left out: 8 used"`` after --skip-bad-files."""
    if found == used:
        return f"{used} images"
    return f"{found} images, {found - used} unreadable left out: {used} used"


#: The kernel-bound measurement per mode: seconds per round, rounds (the best is kept), images cap per process and round.
_KERNEL_BOUND_RUN: dict[str, tuple[float, int, int | None]] = {
    "full": (2.0, 3, None), "quick": (1.0, 3, None), "smoke": (0.25, 2, 8),
}


def _capped_processes_note(workers: list[int], requested: int | None) -> str | None:
    """Why some rows run fewer processes than ``--worker-processes`` asked, or None.

    A process needs at least one of the row's threads, so P is capped at the
    worker count (the row's note says P=...); a user should not have to find that
    in the table.
    """
    if requested is None:
        return None
    capped = [w for w in workers if w < requested]
    if not capped:
        return None
    return (f"--worker-processes {requested} is more than the workers of the rows at "
            f"{','.join(map(str, capped))} workers: there P is the worker count (one thread per process)")


def _kernel_bounds(
    files: list[Path], s: dict[str, Any], cores: int, bad: _BadFiles
) -> tuple[dict[int, tuple[float, int]], dict[int, str]]:
    """Measure the kernel alone in k processes once per distinct k = min(workers, cores).

    Returns:
        ``(rates, errors)``: k -> ``(img/s, images)`` and, for a measurement
        that failed, k -> its one-line error (also printed on stderr).

    Raises:
        BenchError: a measurement failed on a bad image (named).
    """
    seconds, rounds, cap = _KERNEL_BOUND_RUN[s["mode"]]
    rates: dict[int, tuple[float, int]] = {}
    errors: dict[int, str] = {}
    for k in sorted({min(w, cores) for w in s["workers"]}):
        try:
            rates[k] = kernel_bound_rate(files, s["size"], k, seconds=seconds, rounds=rounds, max_images=cap)
            log.info("kernel bound with %d processes: %.1f img/s over %d images", k, *rates[k])
        except BenchError as e:
            log.error("%s", e)
            bad.check()
            errors[k] = str(e)
            print(f"{PROG}: warning: {e}", file=sys.stderr)
    return rates, errors


def import_torchvision_or_fail() -> None:
    """Turn a missing or broken torchvision into a one-line :class:`BenchError`."""
    try:
        import_torchvision()
    except ImportError as e:
        raise BenchError(str(e)) from None


def _report(
    rows: list[dict[str, Any]], python_time: dict[str, float] | None, out: Path, s: dict[str, Any],
    device: str, root: Path,
) -> list[Path]:
    """Print the table, the summary and the Python time; write text and plot. Returns every written file."""
    meta = run_metadata(batch_size=s["batch_size"], size=s["size"], device=device)
    heading = (f"{PROG}: batch {meta['batch_size']}, {meta['size']}x{meta['size']}, {meta['cores']} cores, "
               f"{meta['device']}, Python {meta['python']}, torch {meta['torch']}, {meta['date']}")
    table = format_table(rows, COLUMNS)
    summary_rows = summarize(rows)
    summary = "\n".join([format_table(summary_rows), *bound_notes(summary_rows)])
    pt = format_python_time(python_time)
    text = f"{heading}\ndata: {root}\n\n{table}\n\n{summary}\n\n{pt}\n"
    (out / "results.txt").write_text(text)
    write_plot(rows, out / "throughput.png", meta)
    log.info("results\n%s", text)
    print(f"\n{table}\n\n{summary}\n\n{pt}\n\nwrote:")
    return [out / "results.txt", out / "results.csv", out / "throughput.png", out / "bench.log"]


def run_cli(args: argparse.Namespace) -> tuple[int, list[dict[str, Any]]]:
    """:func:`run` with expected errors as one line on stderr.

    Returns:
        ``(exit status, rows)``: 0, 1 on an expected error, 130 on Ctrl-C.
    """
    try:
        if getattr(args, "proxy", False):
            from threadloader.bench.proxy import run_proxy

            return 0, run_proxy(args)
        if getattr(args, "zoo", False):
            from threadloader.bench.zoo import run_zoo

            return 0, [row._asdict() for row in run_zoo(args)]
        return 0, run(args)
    except BenchError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1, []
    except KeyboardInterrupt:
        return 130, []


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Parse ``argv`` (bench flags only) and :func:`run`.

    Returns:
        The rows of a completed run.

    Raises:
        SystemExit: on a bad flag (status 2, argparse's message), an expected
            error (status 1, one line on stderr) or Ctrl-C (status 130).
    """
    status, rows = run_cli(build_parser().parse_args(argv))
    if status:
        raise SystemExit(status)
    return rows

