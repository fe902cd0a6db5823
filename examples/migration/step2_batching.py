"""Migration step 2: batch with ``default_collate``.

Same dataset, now with ``batch_size=32`` and torch's ``default_collate``: in
``ThreadDataLoader`` collate runs in a worker thread and, unlike DataLoader in
worker processes, the batch does not go through shared memory and a pipe to
reach the training loop. Still no change to the dataset::

    loader = ThreadDataLoader(dataset, batch_size=32, num_workers=8,
                              collate_fn=default_collate)

Run: ``python examples/migration/step2_batching.py [--smoke] [--root DIR]``
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import default_collate
from torchvision import datasets, transforms

from threadloader import ThreadDataLoader
from threadloader.bench import add_example_arguments, compare_loaders, example_data, format_table


def make_dataset(root: str, size: int) -> datasets.ImageFolder:
    """The user's dataset, still untouched."""
    return datasets.ImageFolder(
        root, transform=transforms.Compose([transforms.Resize((size, size)), transforms.PILToTensor()])
    )


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Compare batched loading with default_collate; print and return rows."""
    parser = add_example_arguments(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]))
    args = parser.parse_args(argv)
    root, workers, batch_size, max_batches, size = example_data(args)
    dataset = make_dataset(str(root), size)
    loaders = {
        "DataLoader": lambda w: torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, num_workers=w, collate_fn=default_collate
        ),
        "ThreadDataLoader": lambda w: ThreadDataLoader(
            dataset, batch_size=batch_size, num_workers=w, collate_fn=default_collate
        ),
    }
    rows = compare_loaders(loaders, workers, max_items=max_batches + 1, warmup=1, config="step2 batching")
    print(format_table(rows))
    return rows


if __name__ == "__main__":
    main()
