"""Random crops: decode everything then crop, or decode only what the crop needs.

``RandomResizedCrop`` keeps 8%-100% of an image, then resizes it to 224x224.
Decoding the whole JPEG to throw most of it away wastes work. threadloader's
crop-aware decoding (``decode_image(path, crop=(top, left, height, width),
size=...)``) knows the crop before it decodes: libjpeg-turbo (TurboJPEG 3's
cropping region) stops after the crop's last row, skips the IDCT and colour
conversion of the rows above it and of the MCU columns outside it, and, when
the crop is much larger than the output, decodes at 1/2, 1/4 or 1/8 scale in
the DCT domain. On a platform without a TurboJPEG 3 library the crop is cut
from a full decode (same pixels, no speed-up). ``--source-size 1200x1600``
generates camera-size sources, where DCT scaling adds to the gain.

In training, ``ImageFolder(root, loader=RandomResizedCropLoader(224))`` does
this per sample. This script draws the same random crop boxes
(``random_resized_crop_params``, torchvision's distribution, seeded) for both
methods. It checks that they give the same pixels within a small tolerance
(DCT-domain scaling and resize order round differently). Then it measures
both in ThreadDataLoader over worker counts.

Run: ``python examples/decode_and_crop.py [--smoke] [--root DIR] [--workers 1,2]``
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision import datasets
from torchvision.transforms.v2 import functional as F

from threadloader import Frame, ThreadDataLoader, frame_collate
from threadloader.bench import add_example_arguments, compare_loaders, example_data, format_table, prepare_dataset
from threadloader.io import decode_image, image_size, random_resized_crop_params

FULL = "full decode+crop"
AWARE = "crop-aware decode"
#: Largest acceptable mean absolute difference (levels out of 255) per image.
TOLERANCE = 8.0


def _hw(text: str) -> tuple[int, int]:
    """``"1200x1600"`` -> ``(1200, 1600)`` (height, width)."""
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HxW, e.g. 1200x1600, got {text!r}") from None
    return h, w


def crop_boxes(paths: Sequence[str], seed: int = 0) -> list[tuple[int, int, int, int]]:
    """One ``RandomResizedCrop`` box ``(top, left, height, width)`` per image, reproducibly."""
    g = torch.Generator().manual_seed(seed)
    # image_size reads the header only: no decode to draw a box.
    return [random_resized_crop_params(*image_size(path), generator=g) for path in paths]


def full_decode_crop(path: str, box: tuple[int, int, int, int], size: int) -> np.ndarray:
    """Decode the whole image, crop, resize (antialiased): the classic way."""
    top, left, h, w = box
    pixels = decode_image(path).numpy()[top : top + h, left : left + w]
    chw = torch.from_numpy(np.ascontiguousarray(pixels)).permute(2, 0, 1)
    return F.resize(chw, [size, size], antialias=True).permute(1, 2, 0).numpy()


def crop_aware_decode(path: str, box: tuple[int, int, int, int], size: int) -> np.ndarray:
    """Decode only the crop, straight to the output size."""
    return decode_image(path, crop=box, size=(size, size)).numpy()


class CropDataset(Dataset):
    """``(frame, label)`` for each image, cropped by ``method`` with a fixed box."""

    def __init__(self, samples: list[tuple[str, int]], boxes: list[tuple[int, int, int, int]], method: str, size: int) -> None:
        self.samples, self.boxes, self.method, self.size = samples, boxes, method, size

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, label = self.samples[index]
        box = self.boxes[index]
        if self.method == AWARE:
            return decode_image(path, crop=box, size=(self.size, self.size)), label
        return Frame(full_decode_crop(path, box, self.size)), label


def check_pixels(samples: list[tuple[str, int]], boxes: list[tuple[int, int, int, int]], size: int) -> float:
    """Largest per-image mean absolute difference between the two methods.

    Raises:
        AssertionError: if any image differs by more than ``TOLERANCE``.
    """
    worst = 0.0
    for (path, _), box in zip(samples, boxes):
        a = full_decode_crop(path, box, size).astype(np.float32)
        b = crop_aware_decode(path, box, size).astype(np.float32)
        assert a.shape == b.shape, (path, a.shape, b.shape)
        worst = max(worst, float(np.abs(a - b).mean()))
    if worst > TOLERANCE:
        raise AssertionError(f"crop-aware decode differs by {worst:.2f} levels (> {TOLERANCE})")
    return worst


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Check pixels, then measure both methods over worker counts; print and return rows."""
    parser = add_example_arguments(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]))
    parser.add_argument("--seed", type=int, default=0, help="seed of the crop boxes")
    parser.add_argument("--check", type=int, default=32, help="images whose pixels are compared (default 32)")
    parser.add_argument("--source-size", type=_hw, default=None, metavar="HxW",
                        help="generate sources of this size instead of ImageNet-like ones (e.g. 1200x1600)")
    args = parser.parse_args(argv)
    root, workers, batch_size, max_batches, size = example_data(args)
    if args.source_size is not None and args.root is None:
        root = prepare_dataset(None, cache_dir=args.cache_dir, num_classes=2,
                               images_per_class=4 if args.smoke else 2 * batch_size, size=args.source_size)
    samples = datasets.ImageFolder(str(root)).samples
    boxes = crop_boxes([p for p, _ in samples], args.seed)

    worst = check_pixels(samples[: args.check], boxes[: args.check], size)
    print(f"pixel check: worst mean |full - crop-aware| = {worst:.2f} levels over {min(args.check, len(samples))} images")

    def loader(method: str) -> Any:
        dataset = CropDataset(samples, boxes, method, size)
        return lambda w: ThreadDataLoader(dataset, batch_size=batch_size, num_workers=w, collate_fn=frame_collate)

    rows = compare_loaders(
        {FULL: loader(FULL), AWARE: loader(AWARE)},
        workers,
        max_items=max_batches + 1,
        warmup=1,
        config="random resized crop",
        baseline=FULL,
    )
    for row in rows:
        row["method"] = row.pop("loader")
        row["max_mean_abs_diff"] = round(worst, 2)
    print(format_table(rows, ["method", "workers", "img/s", "first_batch_s", "images", "ratio", "max_mean_abs_diff"]))
    return rows


if __name__ == "__main__":
    main()
