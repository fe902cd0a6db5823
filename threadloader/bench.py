"""``python -m threadloader bench``: DataLoader (processes) against ThreadDataLoader.

The multi-thread preprocessing comparison, in up to four configurations that
each add one stage to the last:

1. ``resize``    decode + resize to 224x224, one sample at a time;
2. ``batch``     + batching (``default_collate`` / ``frame_collate``);
3. ``normalize`` + float conversion and normalization;
4. ``gpu``       + transfer to the GPU (only when CUDA exists).

DataLoader runs the classic pipeline in worker processes: PIL decode,
``Resize((224, 224))`` + ``PILToTensor`` [+ ``ConvertImageDtype`` +
``Normalize``], ``default_collate`` [+ ``pin_memory`` and ``.to(device)``].
ThreadDataLoader runs the frame pipeline in threads: ``decode_image(size=...)``,
``frame_collate`` [+ :func:`threadloader.to_device` normalizing uint8 batches
on the CPU or, with CUDA, on the GPU].

Throughput is warm: the first ``--warmup`` batches (worker start-up, first
reads) are not timed; the time to the first batch is reported on its own.
The helpers here (dataset preparation, measuring, tables, CSV, plot) are reused
by the scripts in ``examples/``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import logging
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "COLUMNS",
    "CONFIGS",
    "LOADERS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "Measurement",
    "FrameLoader",
    "build_loader",
    "add_example_arguments",
    "build_parser",
    "compare_loaders",
    "count_images",
    "default_cache_dir",
    "default_workers",
    "example_data",
    "format_table",
    "main",
    "measure",
    "parse_workers",
    "prepare_dataset",
    "run",
    "run_comparison",
    "summarize",
    "write_csv",
    "write_plot",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

#: Configuration key -> label printed in tables and plots.
CONFIGS: dict[str, str] = {
    "resize": "1 decode+resize",
    "batch": "2 +batching",
    "normalize": "3 +normalize",
    "gpu": "4 +gpu transfer",
}
LOADERS = ("DataLoader", "ThreadDataLoader")
COLUMNS = ("config", "workers", "loader", "img/s", "first_batch_s", "images", "ratio")

#: Generated data set per mode: (classes, images per class, make_imagenet_like kwargs).
_DATA: dict[str, tuple[int, int, dict[str, Any]]] = {
    "full": (10, 100, {}),
    "quick": (4, 48, {}),
    "smoke": (2, 8, {"size": (96, 128)}),
}

log = logging.getLogger("threadloader.bench")


# ----------------------------------------------------------------------------- data


def default_cache_dir() -> Path:
    """Where generated data sets live: ``$THREADLOADER_CACHE`` or ``~/.cache/threadloader``."""
    env = os.environ.get("THREADLOADER_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "threadloader"


def prepare_dataset(
    root: str | os.PathLike[str] | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    num_classes: int = 10,
    images_per_class: int = 100,
    seed: int = 0,
    **kwargs: Any,
) -> Path:
    """Return an ImageFolder-style root: ``root`` itself, or a generated one.

    Args:
        root: the user's own folder (``class/image.jpg``); when given, nothing
            is generated.
        cache_dir: parent of generated data sets (default :func:`default_cache_dir`).
        num_classes: classes to generate.
        images_per_class: images per class to generate.
        seed: generator seed (the data set is deterministic and cached).
        **kwargs: passed to ``make_imagenet_like``.

    Returns:
        The root folder.

    Raises:
        FileNotFoundError: if ``root`` is given but is not a directory.
    """
    if root is not None:
        path = Path(root).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"data root {str(path)!r} is not a directory")
        return path
    from threadloader.datagen import make_imagenet_like

    base = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    # One folder per shape of data set, so quick/smoke/full runs never regenerate each other's.
    name = f"{num_classes}x{images_per_class}-seed{seed}"
    if "size" in kwargs:
        name += "-{}x{}".format(*kwargs["size"])
    target = base / "imagenet-like" / name
    return Path(
        make_imagenet_like(
            target, num_classes=num_classes, images_per_class=images_per_class, seed=seed, **kwargs
        )
    )


def parse_workers(text: str) -> list[int]:
    """Parse ``"1,2,4"`` into ``[1, 2, 4]``.

    Raises:
        argparse.ArgumentTypeError: on anything but positive integers.
    """
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"workers must look like 1,2,4; got {text!r}") from exc
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"workers must be positive integers; got {text!r}")
    return sorted(set(values))


def default_workers(cap: int | None = None) -> list[int]:
    """1, 2, 4, 8, 16 capped at the number of cores (always including the cap)."""
    cores = cap or os.cpu_count() or 1
    values = [w for w in (1, 2, 4, 8, 16) if w <= cores]
    if cores <= 16 and cores not in values:
        values.append(cores)
    return values


# ----------------------------------------------------------------------------- pipelines


class FrameLoader:
    """ImageFolder ``loader`` that decodes straight to a resized :class:`~threadloader.Frame`.

    A class rather than a lambda so that data sets using it stay picklable.
    """

    def __init__(self, size: int | tuple[int, int] = 224) -> None:
        self.size = size

    def __call__(self, path: str) -> Any:
        from threadloader.io import decode_image

        return decode_image(path, size=self.size)


def _hw(size: int | tuple[int, int]) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


def torchvision_dataset(root: str | os.PathLike[str], size: int | tuple[int, int], normalize: bool) -> Any:
    """The classic PIL + torchvision transforms ImageFolder used as the baseline."""
    from torchvision import datasets, transforms

    steps: list[Any] = [transforms.Resize(_hw(size)), transforms.PILToTensor()]
    if normalize:
        steps += [transforms.ConvertImageDtype(torch.float32), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    return datasets.ImageFolder(str(root), transform=transforms.Compose(steps))


def frame_dataset(root: str | os.PathLike[str], size: int | tuple[int, int]) -> Any:
    """ImageFolder whose samples are ``(Frame, label)`` decoded by :class:`FrameLoader`."""
    from torchvision import datasets

    return datasets.ImageFolder(str(root), loader=FrameLoader(_hw(size)))


def _move(loader: Iterable[Any], device: str) -> Iterable[Any]:
    # The baseline's transfer: what a training loop does with a pinned batch.
    for images, labels in loader:
        yield images.to(device, non_blocking=True), labels.to(device, non_blocking=True)


class _Moved:
    """Iterable + len() around :func:`_move` (each ``iter`` starts a new epoch)."""

    def __init__(self, loader: Any, device: str) -> None:
        self.loader, self.device = loader, device

    def __iter__(self) -> Any:
        return _move(self.loader, self.device)

    def __len__(self) -> int:
        return len(self.loader)


def build_loader(
    loader: str,
    config: str,
    root: str | os.PathLike[str],
    *,
    workers: int,
    batch_size: int = 32,
    size: int | tuple[int, int] = 224,
    device: str = "cuda",
) -> Iterable[Any]:
    """Build the iterable for one (loader, config) cell of the comparison.

    Args:
        loader: ``"DataLoader"`` or ``"ThreadDataLoader"``.
        config: a key of :data:`CONFIGS`.
        root: ImageFolder-style root.
        workers: ``num_workers`` (processes or threads).
        batch_size: batch size for the batching configs.
        size: output image size.
        device: device for the ``gpu`` config.

    Returns:
        An iterable of samples (``resize``) or batches.

    Raises:
        ValueError: on an unknown loader or config.
    """
    if config not in CONFIGS:
        raise ValueError(f"unknown config {config!r}; choose from {', '.join(CONFIGS)}")
    batched = config != "resize"
    gpu = config == "gpu"
    if loader == "DataLoader":
        ds = torchvision_dataset(root, size, normalize=config in ("normalize", "gpu"))
        dl = torch.utils.data.DataLoader(
            ds, batch_size=batch_size if batched else None, num_workers=workers, pin_memory=gpu
        )
        return _Moved(dl, device) if gpu else dl
    if loader == "ThreadDataLoader":
        from threadloader import ThreadDataLoader
        from threadloader.device import to_device
        from threadloader.frames import frame_collate

        ds = frame_dataset(root, size)
        kwargs: dict[str, Any] = {"num_workers": workers, "pin_memory": gpu}
        if batched:
            kwargs.update(batch_size=batch_size, collate_fn=frame_collate)
        else:
            kwargs.update(batch_size=None)
        tl = ThreadDataLoader(ds, **kwargs)
        if config == "normalize":
            return to_device(tl, "cpu", normalize=(IMAGENET_MEAN, IMAGENET_STD))
        if gpu:
            return to_device(tl, device, normalize=(IMAGENET_MEAN, IMAGENET_STD))
        return tl
    raise ValueError(f"unknown loader {loader!r}; choose from {', '.join(LOADERS)}")


# ----------------------------------------------------------------------------- measuring


@dataclasses.dataclass
class Measurement:
    """Result of :func:`measure`: warm images, warm seconds, time to the first item."""

    images: int
    seconds: float
    first_batch_s: float

    @property
    def img_per_s(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else float("nan")


def count_images(item: Any) -> int:
    """Images in one loader item: ``N`` of a 4-D tensor (first element of a tuple/list/dict), else 1."""
    if isinstance(item, (tuple, list)) and item:
        item = item[0]
    elif isinstance(item, dict) and item:
        item = next(iter(item.values()))
    if isinstance(item, torch.Tensor) and item.dim() == 4:
        return int(item.shape[0])
    return 1


def _sync(item: Any) -> None:
    # Asynchronous device work belongs to the batch: wait for it before the clock stops.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def measure(
    loader: Iterable[Any],
    *,
    max_items: int | None = None,
    warmup: int = 1,
    counter: Callable[[Any], int] = count_images,
) -> Measurement:
    """Iterate ``loader`` and time it.

    Args:
        loader: any iterable of samples or batches.
        max_items: stop after this many items (None: one epoch).
        warmup: items at the start that are not timed (start-up cost).
        counter: images per item.

    Returns:
        A :class:`Measurement`. If the loader yields no more than ``warmup``
        items, the whole run is timed instead.
    """
    start = time.perf_counter()
    first = None
    warm_start = None
    images = warm_images = 0
    items = 0
    it = iter(loader)
    try:
        for item in it:
            items += 1
            n = counter(item)
            images += n
            if first is None:
                _sync(item)
                first = time.perf_counter() - start
            if items == warmup:
                _sync(item)
                warm_start = time.perf_counter()
            elif items > warmup:
                warm_images += n
            if max_items is not None and items >= max_items:
                break
        _sync(None)
        end = time.perf_counter()
    finally:
        # Ends the epoch now (joins threads / stops processes) rather than at GC.
        close = getattr(it, "close", None) or getattr(it, "_shutdown_workers", None)
        del it
        if close is not None:
            close()
    if warm_start is None or warm_images == 0:
        return Measurement(images, end - start, first or 0.0)
    return Measurement(warm_images, end - warm_start, first or 0.0)


# ----------------------------------------------------------------------------- running


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
) -> list[dict[str, Any]]:
    """Measure every (config, workers, loader) cell.

    Args:
        root: ImageFolder-style root.
        configs: keys of :data:`CONFIGS` (``gpu`` is dropped without CUDA).
        workers: worker counts.
        batch_size: images per batch.
        max_batches: timed-run length in batches (per-sample configs use
            ``max_batches * batch_size`` samples).
        warmup_batches: batches (or ``batch_size`` samples) not timed.
        size: output image size.
        device: the GPU device for the ``gpu`` config.
        loaders: which loaders to run.
        progress: show a tqdm bar on stderr.

    Returns:
        One row per cell with the keys of ``COLUMNS``; ``ratio`` is
        ThreadDataLoader img/s over DataLoader img/s (on ThreadDataLoader rows,
        None elsewhere).
    """
    configs = [c for c in configs if c != "gpu" or torch.cuda.is_available()]
    cells = [(c, w, ld) for c in configs for w in workers for ld in loaders]
    bar = _progress(len(cells), progress)
    rows: list[dict[str, Any]] = []
    try:
        for config, w, name in cells:
            bar.set_description(f"{CONFIGS[config]} w={w} {name}")
            loader = build_loader(
                name, config, root, workers=w, batch_size=batch_size, size=size, device=device
            )
            per = 1 if config != "resize" else batch_size
            m = measure(loader, max_items=(max_batches + warmup_batches) * per, warmup=warmup_batches * per)
            row = _row(CONFIGS[config], w, name, m)
            log.info("measured %s", row)
            rows.append(row)
            bar.set_postfix_str(f"{row['img/s']:.0f} img/s")
            bar.update(1)
    finally:
        bar.close()
    _add_ratios(rows)
    return rows


def _row(config: str, workers: int, loader: str, m: "Measurement") -> dict[str, Any]:
    """One result row (the keys of ``COLUMNS``); ``ratio`` is filled in later."""
    return {
        "config": config,
        "workers": workers,
        "loader": loader,
        "img/s": round(m.img_per_s, 1),
        "first_batch_s": round(m.first_batch_s, 3),
        "images": m.images,
        "ratio": None,
    }


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
        Rows with the keys of ``COLUMNS``.
    """
    bar = _progress(len(factories) * len(workers), progress)
    rows: list[dict[str, Any]] = []
    try:
        for w in workers:
            for name, factory in factories.items():
                bar.set_description(f"{config} w={w} {name}")
                m = measure(factory(w), max_items=max_items, warmup=warmup)
                rows.append(_row(config, w, name, m))
                log.info("measured %s", rows[-1])
                bar.update(1)
    finally:
        bar.close()
    _add_ratios(rows, baseline)
    return rows


def add_example_arguments(
    parser: argparse.ArgumentParser, *, batch_size: int = 32, max_batches: int = 10
) -> argparse.ArgumentParser:
    """Flags shared by the scripts in ``examples/``: data, workers, sizes, ``--smoke``."""
    parser.add_argument("--root", help="your own ImageFolder-style folder (default: generated data)")
    parser.add_argument("--cache-dir", help="where generated data lives (default: $THREADLOADER_CACHE or ~/.cache/threadloader)")
    parser.add_argument("--workers", type=parse_workers, help="worker counts, e.g. 1,2,4 (default: 1,2,4,8,16 capped at the cores)")
    parser.add_argument("--batch-size", type=int, default=batch_size, help=f"images per batch (default {batch_size})")
    parser.add_argument("--max-batches", type=int, default=max_batches, help=f"timed batches per run (default {max_batches})")
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


def _add_ratios(rows: list[dict[str, Any]], baseline: str = "DataLoader") -> None:
    base = {(r["config"], r["workers"]): r["img/s"] for r in rows if r["loader"] == baseline}
    for r in rows:
        b = base.get((r["config"], r["workers"]))
        if r["loader"] != baseline and b:
            r["ratio"] = round(r["img/s"] / b, 2)


class _NoBar:
    def set_description(self, *_: Any) -> None: ...
    def set_postfix_str(self, *_: Any) -> None: ...
    def update(self, *_: Any) -> None: ...
    def close(self) -> None: ...


def _progress(total: int, enabled: bool) -> Any:
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is an optional extra
        return _NoBar()
    return tqdm(total=total, file=sys.stderr, unit="run", dynamic_ncols=True, leave=False)


# ----------------------------------------------------------------------------- output


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Render rows as an aligned text table (None shows as ``-``)."""
    if not rows:
        return "(no rows)"
    columns = list(columns or rows[0].keys())

    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return repr(v)  # values are rounded where they are made
        return str(v)

    body = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.rjust(w) if _numeric(v) else v.ljust(w) for v, w in zip(b, widths)) for b in body]
    return "\n".join(lines)


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Peak img/s per (config, loader) and the thread/DataLoader ratio of peaks."""
    out = []
    for config in dict.fromkeys(r["config"] for r in rows):
        peaks = {
            name: max((r["img/s"] for r in rows if r["config"] == config and r["loader"] == name), default=None)
            for name in LOADERS
        }
        dl, tl = peaks["DataLoader"], peaks["ThreadDataLoader"]
        out.append(
            {
                "config": config,
                "DataLoader peak": dl,
                "ThreadDataLoader peak": tl,
                "ratio": round(tl / dl, 2) if dl and tl else None,
            }
        )
    return out


def write_csv(rows: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Write rows (all the same keys) as CSV; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0].keys()) if rows else list(COLUMNS))
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_plot(
    rows: Sequence[dict[str, Any]], path: str | os.PathLike[str], title: str = "Throughput vs workers"
) -> Path:
    """Plot img/s against workers, one line per loader x config (solid: threads)."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 5))
    configs = list(dict.fromkeys(r["config"] for r in rows))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, config in enumerate(configs):
        for name in dict.fromkeys(r["loader"] for r in rows):
            pts = sorted((r["workers"], r["img/s"]) for r in rows if r["config"] == config and r["loader"] == name)
            if not pts:
                continue
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                marker="o",
                color=colors[i % len(colors)],
                linestyle="--" if name == "DataLoader" else "-",
                label=f"{name} {config}",
            )
    workers = sorted({r["workers"] for r in rows})
    if workers:
        ax.set_xticks(workers)
    ax.set_xlabel("workers (processes / threads)")
    ax.set_ylabel("images / s")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the bench flags to ``parser`` (shared by ``python -m threadloader bench``)."""
    parser.add_argument("--root", help="your own ImageFolder-style folder (default: generated data)")
    parser.add_argument("--cache-dir", help="where generated data lives (default: $THREADLOADER_CACHE or ~/.cache/threadloader)")
    parser.add_argument("--workers", type=parse_workers, help="worker counts, e.g. 1,2,4 (default: 1,2,4,8,16 capped at the cores)")
    parser.add_argument("--batch-size", type=int, default=None, help="images per batch (default 32)")
    parser.add_argument("--max-batches", type=int, default=None, help="timed batches per run (default 20)")
    parser.add_argument("--warmup", type=int, default=1, help="batches not timed at the start of each run (default 1)")
    parser.add_argument("--size", type=int, default=224, help="output image side (default 224)")
    parser.add_argument("--configs", default=None, help=f"comma-separated subset of {','.join(CONFIGS)} (default: all; gpu needs CUDA)")
    parser.add_argument("--device", default="cuda", help="device of the gpu config (default cuda)")
    parser.add_argument("--out", default="bench-out", help="output folder for table, CSV, PNG and log (default ./bench-out)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small run, about 2 minutes on 2 cores")
    mode.add_argument("--smoke", action="store_true", help="tiny run for tests (seconds)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The stand-alone parser of :func:`main`."""
    parser = argparse.ArgumentParser(
        prog="python -m threadloader bench", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return add_arguments(parser)


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    defaults = {
        "full": dict(batch_size=32, max_batches=20, workers=default_workers()),
        "quick": dict(batch_size=32, max_batches=5, workers=[1, 2]),
        "smoke": dict(batch_size=4, max_batches=2, workers=[1, 2]),
    }[mode]
    configs = list(CONFIGS) if not args.configs else [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        raise SystemExit(f"unknown config(s) {unknown}; choose from {', '.join(CONFIGS)}")
    return {
        "mode": mode,
        "batch_size": args.batch_size or defaults["batch_size"],
        "max_batches": args.max_batches or defaults["max_batches"],
        "workers": args.workers or defaults["workers"],
        "configs": configs,
        "size": 64 if mode == "smoke" and args.size == 224 else args.size,
    }


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Run the bench for parsed ``args``; print the table and write CSV, PNG and log.

    Returns:
        The result rows (see :func:`run_comparison`).
    """
    s = _settings(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(out / "bench.log", mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        log.info(
            "threadloader bench: mode=%s python=%s torch=%s cpus=%s cuda=%s platform=%s",
            s["mode"], platform.python_version(), torch.__version__, os.cpu_count(),
            torch.cuda.is_available(), platform.platform(),
        )
        classes, per_class, extra = _DATA[s["mode"]]
        t0 = time.perf_counter()
        root = prepare_dataset(
            args.root, cache_dir=args.cache_dir, num_classes=classes, images_per_class=per_class, **extra
        )
        log.info("data root %s ready in %.1f s; settings %s", root, time.perf_counter() - t0, s)
        if "gpu" in s["configs"] and not torch.cuda.is_available():
            log.info("CUDA not available: skipping the gpu config")
        rows = run_comparison(
            root,
            configs=s["configs"],
            workers=s["workers"],
            batch_size=s["batch_size"],
            max_batches=s["max_batches"],
            warmup_batches=args.warmup,
            size=s["size"],
            device=args.device,
            progress=not args.no_progress,
        )
        table = format_table(rows, COLUMNS)
        summary = format_table(summarize(rows))
        write_csv(rows, out / "results.csv")
        write_plot(rows, out / "throughput.png", title=f"DataLoader vs ThreadDataLoader ({os.cpu_count()} cores)")
        (out / "results.txt").write_text(table + "\n\n" + summary + "\n")
        log.info("results\n%s\n\n%s", table, summary)
        print(f"data: {root}")
        print(table)
        print()
        print(summary)
        print(f"\nwrote {out / 'results.csv'}, {out / 'throughput.png'}, {out / 'bench.log'}")
        return rows
    finally:
        log.removeHandler(handler)
        handler.close()


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Parse ``argv`` (bench flags only) and :func:`run`."""
    return run(build_parser().parse_args(argv))
