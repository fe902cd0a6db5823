"""Migration step 1: swap the import, change nothing else.

``ThreadDataLoader`` has DataLoader's exact signature, so an unchanged
torchvision ``ImageFolder`` (PIL decode, ``Resize`` + ``PILToTensor``) runs on
worker *threads* by changing one line::

    from torch.utils.data import DataLoader                      # before
    from threadloader import ThreadDataLoader as DataLoader      # after

With ``batch_size=None`` each item is one sample, as in the original code.
Threads help because PIL and torch release the GIL while decoding and
resizing, and nothing is pickled between processes. This script measures both
side by side in the same run.

Run: ``python examples/migration/step1_swap_import.py [--smoke] [--root DIR]``
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import torch
from torchvision import datasets, transforms

from threadloader import ThreadDataLoader
from threadloader.bench import add_example_arguments, compare_loaders, example_data, format_table


def make_dataset(root: str, size: int) -> datasets.ImageFolder:
    """The user's dataset, untouched by the migration."""
    return datasets.ImageFolder(
        root, transform=transforms.Compose([transforms.Resize((size, size)), transforms.PILToTensor()])
    )


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Compare DataLoader and ThreadDataLoader on per-sample loading; print and return rows."""
    parser = add_example_arguments(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]))
    args = parser.parse_args(argv)
    root, workers, batch_size, max_batches, size = example_data(args)
    dataset = make_dataset(str(root), size)
    loaders = {
        "DataLoader": lambda w: torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=w),
        # The migration: the same call on the other class.
        "ThreadDataLoader": lambda w: ThreadDataLoader(dataset, batch_size=None, num_workers=w),
    }
    # Per-sample items: time as many samples as the other steps time images.
    rows = compare_loaders(
        loaders, workers, max_items=(max_batches + 1) * batch_size, warmup=batch_size, config="step1 swap import"
    )
    print(format_table(rows))
    return rows


if __name__ == "__main__":
    main()
