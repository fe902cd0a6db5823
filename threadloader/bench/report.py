"""Output of the bench: progress bars, the printed table, CSV written row by row, the plot, run metadata."""

from __future__ import annotations

import contextlib
import csv
import datetime
import os
import platform
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from threadloader.bench.pipelines import BASELINE, KERNEL_BOUND
from threadloader.bench.python_time import native_calls_label
from threadloader.bench.usage import usable_cores

__all__ = [
    "COLUMNS",
    "CsvRows",
    "bound_notes",
    "build_figure",
    "format_python_time",
    "format_table",
    "label_positions",
    "progress_bar",
    "run_metadata",
    "summarize",
    "write_csv",
    "write_plot",
]

COLUMNS = ("config", "workers", "loader", "img/s", "first_batch_s", "images", "cores", "faults/img", "ratio", "note")

#: Fixed precision per column in printed tables (other floats: 2 decimals).
_FORMATS = {"img/s": "{:.1f}", "first_batch_s": "{:.3f}", "cores": "{:.1f}", "faults/img": "{:.1f}",
            "ratio": "{:.2f}", "peak img/s": "{:.1f}", "vs DataLoader": "{:.2f}", "of kernel bound": "{:.2f}"}


class _NoBar:
    def set_description(self, *_: Any) -> None: ...
    def set_postfix_str(self, *_: Any) -> None: ...
    def update(self, *_: Any) -> None: ...
    def close(self) -> None: ...


@contextlib.contextmanager
def progress_bar(total: int, enabled: bool, **kwargs: Any) -> Iterator[Any]:
    """A tqdm bar on stderr (a no-op object when disabled or tqdm is missing); closed on exit."""
    bar: Any = _NoBar()
    if enabled and total:
        try:
            from tqdm import tqdm

            bar = tqdm(total=total, file=sys.stderr, dynamic_ncols=True, leave=False, **kwargs)
        except ImportError:  # tqdm is an optional extra
            pass
    try:
        yield bar
    finally:
        bar.close()


def _cell(column: str, value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return _FORMATS.get(column, "{:.2f}").format(value)
    return str(value)


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Render rows as an aligned text table: numbers right-aligned at a fixed precision, None as ``-``."""
    if not rows:
        return "(no rows)"
    columns = list(columns or rows[0].keys())
    body = [[_cell(c, r.get(c)) for c in columns] for r in rows]
    numeric = [any(_numeric(r.get(c)) for r in rows) for c in columns]
    widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        out = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(cells, widths, numeric)]
        return "  ".join(out).rstrip()

    return "\n".join([line(columns), "  ".join("-" * w for w in widths), *(line(b) for b in body)])


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per config and loader: the peak img/s, where it was reached, its ratio to DataLoader's
    peak and to the kernel bound at the same worker count, and its cores and faults/img there."""
    out = []
    for config in dict.fromkeys(r["config"] for r in rows):
        mine = [r for r in rows if r["config"] == config and r["img/s"]]
        peaks: dict[str, dict[str, Any]] = {}
        for r in mine:
            if r["loader"] not in peaks or r["img/s"] > peaks[r["loader"]]["img/s"]:
                peaks[r["loader"]] = r
        base = peaks.get(BASELINE)
        bound = {r["workers"]: r["img/s"] for r in mine if r["loader"] == KERNEL_BOUND}
        for name, peak in peaks.items():
            if name == KERNEL_BOUND:
                continue
            b = bound.get(peak["workers"])
            out.append({
                "config": config,
                "loader": name,
                "peak img/s": peak["img/s"],
                "at workers": peak["workers"],
                "vs DataLoader": round(peak["img/s"] / base["img/s"], 2) if base else None,
                "of kernel bound": round(peak["img/s"] / b, 2) if b else None,
                # At the peak: the cores it kept busy, the fresh pages it touched per image.
                "cores": peak.get("cores"),
                "faults/img": peak.get("faults/img"),
            })
    return out


def bound_notes(summary: Sequence[dict[str, Any]]) -> list[str]:
    """One line per loader whose peak exceeds the kernel bound (``of kernel bound`` above 1.0).

    The bound is measured after the loaders. A machine that got busier in
    between gives a bound below what the loaders reached: the line says so,
    so that nobody reads it as a loader beating its own kernel.
    """
    over = [s for s in summary if s.get("of kernel bound") and s["of kernel bound"] > 1.0]
    return [
        f"note: {s['loader']} ({s['config']}) reached {s['of kernel bound']:.2f} of the kernel bound: the machine was "
        f"busier while the bound was measured, so it is no bound in this run; rerun on a quiet machine"
        for s in over
    ]


class CsvRows:
    """A CSV file that receives rows as they are measured (flushed each time), so an
    interrupted run keeps every finished row."""

    def __init__(self, path: str | os.PathLike[str], columns: Sequence[str] = COLUMNS) -> None:
        self.path = Path(path)
        self._file = self.path.open("w", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=list(columns), extrasaction="ignore")
        self._writer.writeheader()
        self._file.flush()
        self.count = 0

    def __call__(self, row: dict[str, Any]) -> None:
        self._writer.writerow(row)
        self._file.flush()
        self.count += 1

    def close(self) -> None:
        self._file.close()


def write_csv(rows: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Write rows as CSV (the columns of the first row, or :data:`COLUMNS`); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = CsvRows(path, list(rows[0].keys()) if rows else COLUMNS)
    try:
        for r in rows:
            writer(r)
    finally:
        writer.close()
    return path


def run_metadata(*, batch_size: int, size: int, device: str = "cpu") -> dict[str, Any]:
    """What a reader needs to judge a figure: batch, image size, cores, device, versions, date."""
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "batch_size": batch_size,
        "size": size,
        "cores": usable_cores(),
        "device": gpu or "no GPU",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "platform": platform.platform(),
    }


def _footer(meta: dict[str, Any]) -> str:
    return (
        f"batch {meta['batch_size']}, {meta['size']}x{meta['size']} images, {meta['cores']} cores, "
        f"{meta['device']}, Python {meta['python']}, torch {meta['torch']}, {meta['date']}"
    )


def _pack(items: Sequence[str], width: int) -> list[str]:
    """Join items with ", " into lines of at most ``width`` characters, never splitting an item."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + 2 + len(item) <= width:
            lines[-1] += ", " + item
        else:
            lines.append(item)
    return lines


def format_python_time(pt: dict[str, float] | None) -> str:
    """The frame path's Python time per image (from ``python_time.python_time_per_image``), two lines at most."""
    if not pt:
        return "Python time per image: not measured"
    lines = []
    if "python_us" in pt:
        python = f"{pt['python_us']:.1f} us" if pt["python_us"] >= 0 else "not resolved (below zero: noise)"
        lines.append(
            f"Python time per image (frame path, 1 thread, {pt['images']:.0f} small JPEGs): "
            f"{pt['path_us']:.1f} us through ThreadDataLoader - {pt['native_us']:.1f} us of its native calls "
            f"({native_calls_label()}) = {python}"
        )
    if "data_python_us" in pt:
        spread = pt["data_native_spread_us"]
        # A difference the native time's own spread covers says nothing (it can even be negative).
        python = f"{pt['data_python_us']:.1f} us" if pt["data_python_us"] > spread else "not resolved"
        lines.append(
            f"  the same on this run's JPEGs ({pt['data_images']:.0f}): {pt['data_path_us']:.1f} - "
            f"{pt['data_native_us']:.1f} = {python} (the native time varied by {spread:.1f} us between rounds)"
        )
    return "\n".join(lines)


def build_figure(rows: Sequence[dict[str, Any]], meta: dict[str, Any], title: str | None = None) -> Any:
    """The throughput figure: one panel per config, img/s against workers, one line per loader.

    The y axes start at 0; each loader's peak carries its speed-up over
    DataLoader's peak (``x2.50``); the legend sits below the panels, outside
    the data; the title's second line gives batch, image size, cores,
    device, Python and torch versions and the date.

    Returns:
        A ``matplotlib.figure.Figure`` (no pyplot state, no display needed).
    """
    from matplotlib.figure import Figure

    configs = list(dict.fromkeys(r["config"] for r in rows)) or ["(no rows)"]
    loaders = list(dict.fromkeys(r["loader"] for r in rows))
    fig = Figure(figsize=(max(5.0, 4.2 * len(configs)), 5.2), layout="constrained")
    axes = fig.subplots(1, len(configs), squeeze=False)[0]
    colors = ["#1f77b4", "#9467bd", "#d62728", "#ff7f0e", "#7f7f7f"]
    styles = {BASELINE: "--", KERNEL_BOUND: ":"}
    workers = sorted({r["workers"] for r in rows})
    for ax, config in zip(axes, configs):
        mine = [r for r in rows if r["config"] == config and r["img/s"]]
        base = max((r["img/s"] for r in mine if r["loader"] == BASELINE), default=None)
        peaks = []  # (workers, peak, color) of each loader labelled with its speed-up
        markers: dict[int, list[float]] = {}
        for i, name in enumerate(loaders):
            pts = sorted((r["workers"], r["img/s"]) for r in mine if r["loader"] == name)
            if not pts:
                continue
            for w, y in pts:
                markers.setdefault(w, []).append(y)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=colors[i % len(colors)],
                    linestyle=styles.get(name, "-"), label=name)
            if base and name not in (BASELINE, KERNEL_BOUND):
                peaks.append((*max(pts, key=lambda p: p[1]), colors[i % len(colors)]))
        ax.set_ylim(bottom=0, top=max(ax.get_ylim()[1], 1.0) * 1.15)  # room for the labels above the peaks
        _label_peaks(ax, peaks, base, markers)
        ax.set_title(config, fontsize=10)
        ax.set_xlabel("workers (processes / threads)")
        if workers:
            ax.set_xticks(workers)
        ax.grid(True, alpha=0.3)
        ax.margins(x=0.1)  # labels at the first and last worker count stay inside
    axes[0].set_ylabel("images / s")
    heading = title or "DataLoader vs ThreadDataLoader (xN: a loader's peak over DataLoader's peak)"
    width = int(fig.get_figwidth() * 13)  # characters per line at this font size
    lines = textwrap.wrap(heading, width) + _pack(_footer(meta).split(", "), width)
    fig.suptitle("\n".join(lines), fontsize=9)
    handles, labels = [], []
    for ax in axes:  # every loader once, even one missing from the first panel
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 3), fontsize=8)
    return fig


def label_positions(
    peaks: Sequence[tuple[int, float]], markers: dict[int, list[float]], height: float, marker: float
) -> list[float]:
    """The bottom of each peak's label, in data units, clear of every marker and of the other labels.

    Args:
        peaks: ``(workers, img/s)`` of each labelled peak.
        markers: workers -> the y of every marker drawn at that worker count.
        height: one label's height.
        marker: a marker's half height.

    Returns:
        One y per peak, in the order given. A label starts just above its
        peak and moves up past any marker or label it would cover.
    """
    taken: dict[int, list[tuple[float, float]]] = {}
    for w, ys in markers.items():
        taken[w] = [(y - marker, y + marker) for y in ys]
    out: dict[int, float] = {}
    for i in sorted(range(len(peaks)), key=lambda j: (peaks[j][0], peaks[j][1])):
        w, peak = peaks[i]
        y = peak + marker
        moved = True
        while moved:  # each pass either settles or moves above one obstacle
            moved = False
            for low, high in taken.get(w, []):
                if y < high and y + height > low:
                    y, moved = high, True
        taken.setdefault(w, []).append((y, y + height))
        out[i] = y
    return [out[i] for i in range(len(peaks))]


def _label_peaks(ax: Any, peaks: list[tuple[int, float, str]], base: float | None, markers: dict[int, list[float]]) -> None:
    """Write ``xN`` (peak / DataLoader's peak) above each loader's peak, in its colour, clear of the markers."""
    top = ax.get_ylim()[1]
    ys = label_positions([(w, p) for w, p, _ in peaks], markers, height=0.055 * top, marker=0.03 * top)
    for (w, peak, color), y in zip(peaks, ys):
        ax.annotate(f"x{peak / base:.2f}", (w, y), ha="center", va="bottom", fontsize=8, color=color,
                    bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none", alpha=0.8))
    if ys:  # a label moved above the others stays inside the panel
        ax.set_ylim(top=max(top, max(ys) + 0.08 * top))


def write_plot(
    rows: Sequence[dict[str, Any]], path: str | os.PathLike[str], meta: dict[str, Any] | None = None,
    title: str | None = None,
) -> Path:
    """Save :func:`build_figure` as a PNG; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = build_figure(rows, meta or run_metadata(batch_size=0, size=0), title)
    fig.savefig(path, dpi=100)
    return path
