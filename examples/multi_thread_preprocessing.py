"""Multi-thread preprocessing: DataLoader processes against ThreadDataLoader threads.

Four configurations, each adding one stage to the previous one:

1. decode + resize to 224x224 (one sample per item);
2. + batching (``default_collate`` / ``frame_collate``);
3. + normalization to float (DataLoader: ``Normalize`` per sample in the
   workers; threads: ``frame_collate(normalize=...)`` in the worker threads,
   one fused multiply-add per batch, never on the consumer thread);
4. + transfer to the GPU (only with CUDA; threads move uint8 and normalize on
   the GPU, DataLoader moves pinned float32 — 4x the bytes).

The lesson: with threads, decode and resize run in parallel without pickling
or shared-memory hops, and the float work moves to the end of the pipeline
(or to the GPU), where it is done once per batch. This is the same comparison
as ``python -m threadloader bench``; the code lives in ``threadloader.bench``.

Run: ``python examples/multi_thread_preprocessing.py [--smoke] [--root DIR] [--workers 1,2,4]``
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from threadloader.bench import (
    COLUMNS,
    CONFIGS,
    add_example_arguments,
    example_data,
    format_table,
    run_comparison,
    summarize,
)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Run the four configurations over worker counts; print and return rows."""
    parser = add_example_arguments(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]))
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of " + ",".join(CONFIGS))
    parser.add_argument("--device", default="cuda", help="device of the gpu config (used only with CUDA)")
    args = parser.parse_args(argv)
    root, workers, batch_size, max_batches, size = example_data(args)
    rows = run_comparison(
        root,
        configs=[c for c in args.configs.split(",") if c],
        workers=workers,
        batch_size=batch_size,
        max_batches=max_batches,
        size=size,
        device=args.device,
        progress=False,
    )
    print(format_table(rows, COLUMNS))
    print()
    print(format_table(summarize(rows)))
    return rows


if __name__ == "__main__":
    main()
