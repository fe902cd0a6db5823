"""GPU preprocessing: ship uint8, normalize (and mirror) on the device.

The DALI/FFCV-style pipeline. Three ways to get normalized, randomly mirrored
float batches onto the device:

* ``DataLoader``: PIL + ``RandomHorizontalFlip`` + ``Normalize`` per sample in
  worker processes, then a pinned float32 batch copied to the device;
* ``threads+cpu-normalize``: frames decoded in threads, collated, and
  normalized/mirrored on the CPU inside the worker (the collate function), then
  copied as float32;
* ``threads+to_device``: frames collated into a pinned uint8 batch that
  :func:`threadloader.to_device` copies on a side CUDA stream (4x fewer bytes
  than float32) and normalizes + mirrors on the GPU in one fused step, one or
  two batches ahead of the training loop.

Without CUDA the script still runs: ``to_device(..., "cpu")`` uses the same
math on the CPU (in the consumer thread), and the script says so — the numbers
then show the CPU fallback, not the GPU pipeline.

Run: ``python examples/gpu_preprocessing.py [--smoke] [--root DIR] [--device cuda]``
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Sequence
from typing import Any

import torch
from torchvision import datasets, transforms

from threadloader import ThreadDataLoader, frame_collate, to_device
from threadloader.bench import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    add_example_arguments,
    compare_loaders,
    example_data,
    format_table,
)
from threadloader.device import ImageTransform
from threadloader.io import decode_image


class NormalizingCollate:
    """``frame_collate`` then the same fused normalize + mirror, on the CPU in the worker."""

    def __init__(self, mirror: float) -> None:
        self.transform = ImageTransform(normalize=(IMAGENET_MEAN, IMAGENET_STD), mirror=mirror)

    def __call__(self, samples: list[Any]) -> Any:
        images, labels = frame_collate(samples)
        return self.transform(images, self.transform.draw_flips(images.shape[0])), labels


def _moved(loader: Any, device: str) -> Any:
    for images, labels in loader:
        yield images.to(device, non_blocking=True), labels.to(device, non_blocking=True)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Compare CPU-side and device-side normalization; print and return rows."""
    parser = add_example_arguments(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]))
    parser.add_argument("--device", default="cuda", help="target device (default cuda; cpu when CUDA is missing)")
    parser.add_argument("--mirror", type=float, default=0.5, help="horizontal flip probability (default 0.5)")
    args = parser.parse_args(argv)
    root, workers, batch_size, max_batches, size = example_data(args)
    device = args.device
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available: running the CPU fallback of to_device (same math, on the CPU).")
        device = "cpu"
    pin = torch.device(device).type == "cuda"

    pil_dataset = datasets.ImageFolder(
        str(root),
        transform=transforms.Compose(
            [
                transforms.Resize((size, size)),
                transforms.RandomHorizontalFlip(args.mirror),
                transforms.PILToTensor(),
                transforms.ConvertImageDtype(torch.float32),
                transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
            ]
        ),
    )
    frames = datasets.ImageFolder(str(root), loader=functools.partial(decode_image, size=(size, size)))

    def dataloader(w: int) -> Any:
        return _moved(torch.utils.data.DataLoader(pil_dataset, batch_size=batch_size, num_workers=w, pin_memory=pin), device)

    def cpu_normalize(w: int) -> Any:
        loader = ThreadDataLoader(
            frames, batch_size=batch_size, num_workers=w, collate_fn=NormalizingCollate(args.mirror), pin_memory=pin
        )
        return _moved(loader, device)

    def device_normalize(w: int) -> Any:
        loader = ThreadDataLoader(frames, batch_size=batch_size, num_workers=w, collate_fn=frame_collate, pin_memory=pin)
        return to_device(loader, device, normalize=(IMAGENET_MEAN, IMAGENET_STD), mirror=args.mirror)

    rows = compare_loaders(
        {"DataLoader": dataloader, "threads+cpu-normalize": cpu_normalize, "threads+to_device": device_normalize},
        workers,
        max_items=max_batches + 1,
        warmup=1,
        config=f"normalize+mirror on {device}",
    )
    for row in rows:
        row["device"] = device
    print(format_table(rows))
    return rows


if __name__ == "__main__":
    main()
