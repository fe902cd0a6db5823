"""``python -m threadloader bench``: DataLoader (processes) against ThreadDataLoader.

The multi-thread preprocessing comparison, in up to four configurations that
each add one stage to the last:

1. ``resize``    decode + resize, one sample at a time;
2. ``batch``     + batching (``default_collate`` / ``frame_collate``);
3. ``normalize`` + float conversion and normalization;
4. ``gpu``       + transfer to the GPU (only when CUDA exists).

Rows:

* DataLoader with the classic PIL + torchvision pipeline in worker processes;
* DataLoader's processes running the frame kernel (``decode_image`` +
  ``frame_collate``);
* ThreadDataLoader running that kernel in threads;
* the same spread over ``worker_processes=P`` child processes (where
  ThreadDataLoader has that keyword);
* the kernel bound, measured: the kernel alone in k = min(workers, cores)
  independent processes at once, one thread each. Its rate is all their
  images over the span from the first start to the last end.

Worker counts go up to twice the cores.

Throughput is warm: the first ``--warmup`` batches are not timed. Never fewer
than the in-flight depth are left untimed (2 x workers samples or batches:
what was made before the clock could start). The time to the first batch is
reported on its own. A run too short to time one batch after warm-up gets no rate. The Python time
per image of the frame path (its single-thread time minus that of its native
calls alone) is printed below the table.

Modules: ``cli`` (flags, checks, the run), ``data`` (generated data, --root
checks), ``pipelines`` (the loader configurations), ``measure`` (timing
loaders), ``kernel_bound`` (the kernel alone in k processes), ``python_time``
(Python time per image), ``usage`` (CPU time and page faults from /proc),
``report`` (table, CSV, plot). The names below are re-exported for the
scripts in ``examples/``.
"""

from __future__ import annotations

from threadloader.bench.cli import (
    add_arguments,
    add_example_arguments,
    bench_workers,
    build_parser,
    default_workers,
    example_data,
    main,
    parse_workers,
    run,
    run_cli,
)
from threadloader.bench.data import BenchError, default_cache_dir, prepare_dataset
from threadloader.bench.measure import Measurement, compare_loaders, count_images, measure, run_comparison
from threadloader.bench.pipelines import (
    ALL_LOADERS,
    CONFIGS,
    IMAGENET_MEAN,
    IMAGENET_STD,
    LOADERS,
    FrameLoader,
    build_loader,
)
from threadloader.bench.report import COLUMNS, build_figure, format_table, summarize, write_csv, write_plot

__all__ = [
    "ALL_LOADERS",
    "BenchError",
    "COLUMNS",
    "CONFIGS",
    "FrameLoader",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "LOADERS",
    "Measurement",
    "add_arguments",
    "add_example_arguments",
    "bench_workers",
    "build_figure",
    "build_loader",
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
    "run_cli",
    "run_comparison",
    "summarize",
    "write_csv",
    "write_plot",
]
