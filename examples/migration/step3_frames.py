"""Migration step 3: decode to frames and collate them into one buffer.

The thread-native image path replaces PIL + transforms with two pieces:

* ``decode_image(path, size=(224, 224))`` decodes JPEGs with libjpeg-turbo
  (GIL released, DCT-domain downscaling when it can), returning a ``Frame``
  (HWC uint8) whose resize is pending — no tensor per image;
* ``frame_collate`` resizes each frame with torch's uint8 kernel straight into
  its slot of one ``(N, H, W, C)`` uint8 buffer (reused once you drop the batch)
  and returns the ``(N, C, H, W)`` channels-last view: the same shape and dtype
  as ``PILToTensor`` + ``default_collate``, so the training loop is unchanged::

    dataset = ImageFolder(root, loader=functools.partial(decode_image, size=(224, 224)))
    loader = ThreadDataLoader(dataset, batch_size=32, num_workers=8,
                              collate_fn=frame_collate)

  If the loop normalizes on the CPU, let the workers do it:
  ``collate_fn=functools.partial(frame_collate, normalize=(mean, std))``.

The baseline is step 2's DataLoader pipeline, measured in the same run.

Run: ``python examples/migration/step3_frames.py [--smoke] [--root DIR]``
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import default_collate
from torchvision import datasets, transforms

from threadloader import ThreadDataLoader, frame_collate
from threadloader.bench import add_example_arguments, compare_loaders, example_data, format_table
from threadloader.io import decode_image


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Compare the frame pipeline against DataLoader with PIL; print and return rows."""
    parser = add_example_arguments(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]))
    args = parser.parse_args(argv)
    root, workers, batch_size, max_batches, size = example_data(args)
    pil_dataset = datasets.ImageFolder(
        str(root), transform=transforms.Compose([transforms.Resize((size, size)), transforms.PILToTensor()])
    )
    # functools.partial, not a lambda: the dataset stays picklable.
    frame_dataset = datasets.ImageFolder(str(root), loader=functools.partial(decode_image, size=(size, size)))
    loaders = {
        "DataLoader": lambda w: torch.utils.data.DataLoader(
            pil_dataset, batch_size=batch_size, num_workers=w, collate_fn=default_collate
        ),
        "ThreadDataLoader": lambda w: ThreadDataLoader(
            frame_dataset, batch_size=batch_size, num_workers=w, collate_fn=frame_collate
        ),
    }
    rows = compare_loaders(loaders, workers, max_items=max_batches + 1, warmup=1, config="step3 frames")
    print(format_table(rows))
    return rows


if __name__ == "__main__":
    main()
