"""ImageNet-style input pipeline: DataLoader vs ThreadDataLoader vs decode_image.

Runs, on one generated ImageFolder (see threadloader.images.datagen), in one process:

1. DataLoader (worker processes) + ImageFolder + Resize((S, S)) + PILToTensor
2. the same code with the class swapped to ThreadDataLoader
   2p. ... and ``worker_processes=P`` (the threads spread over P processes:
   PIL's per-image Python holds the GIL)
3. ThreadDataLoader + decode_image(size=(S, S)) + frame_collate
4. DataLoader (processes) + decode_image + frame_collate (same kernel as 3)
5. kernel bound: min(workers, usable cores) x single-thread decode+resize rate, measured here
6. RandomResizedCrop, single thread: torchvision (PIL decode + crop +
   resize), full decode_image + crop + resize, and RandomResizedCropLoader
   (crop chosen from the header, only the crop decoded, DCT-scaled when the
   crop is large enough).

    python examples/image_pipeline_benchmark.py --workers 2 --batches 25

Importable: ``main(argv)`` returns the table rows (the test suite runs it on
tiny data with ``--smoke``).
"""

from __future__ import annotations

import argparse
import functools
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torchvision.transforms as T
from torch.utils.data import DataLoader, RandomSampler
from torchvision.datasets import ImageFolder

from threadloader import ThreadDataLoader, frame_collate
from threadloader.bench import prepare_dataset
from threadloader.bench.usage import usable_cores
from threadloader.images.datagen import make_imagenet_like
from threadloader.io import RandomResizedCropLoader, decode_image, random_resized_crop_params


def _rate(loader: Iterable, batches: int, batch_size: int, warmup: int = 2) -> float:
    """Images per second over ``batches`` batches after ``warmup`` batches (at least the in-flight depth)."""
    it = iter(loader)
    for _ in range(warmup):
        next(it)
    start = time.perf_counter()
    n = 0
    for _ in range(batches):
        x = next(it)[0]
        n += x.shape[0]
    rate = n / (time.perf_counter() - start)
    del it  # shut the workers down before the next contender starts
    return rate


def _full_decode_rrc(path: Path, size: int) -> torch.Tensor:
    """Random-resized crop the classic way: decode everything, crop, resize."""
    pixels = decode_image(path).numpy()
    top, left, h, w = random_resized_crop_params(pixels.shape[0], pixels.shape[1])
    crop = torch.from_numpy(pixels[top:top + h, left:left + w]).permute(2, 0, 1).unsqueeze(0)
    return torch.nn.functional.interpolate(crop, size=(size, size), mode="bilinear", antialias=True)


def _kernel_rate(paths: list[Path], fn: Callable[[Path], Any], seconds: float) -> float:
    """Single-thread images per second of ``fn`` over ``paths`` (cycled)."""
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn(paths[n % len(paths)])
        n += 1
    return n / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Run the benchmark; print and return the rows."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--worker-processes", type=int, default=None,
                   help="P for row 2p (default: workers // 2, at least 1)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--batches", type=int, default=25, help="timed batches per contender")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--data", type=Path, default=None,
                   help="where the generated ImageFolder is cached (its own folder: ImageFolder takes every "
                        "subfolder as a class; default: a folder named by its parameters under --cache-dir)")
    p.add_argument("--cache-dir", help="default: $THREADLOADER_CACHE or ~/.cache/threadloader")
    p.add_argument("--images-per-class", type=int, default=100)
    p.add_argument("--smoke", "--quick", dest="quick", action="store_true",
                   help="tiny data and few batches, seconds (--quick is the same)")
    args = p.parse_args(argv)
    if args.workers < 1:
        p.error(f"--workers must be >= 1, got {args.workers}")
    procs = args.worker_processes if args.worker_processes is not None else max(1, args.workers // 2)
    if not 1 <= procs <= args.workers:
        p.error(f"--worker-processes must be between 1 and --workers ({args.workers}), got {procs}")
    if args.quick:
        args.batches, args.batch_size, args.images_per_class, args.size = 2, 4, 4, 32

    image_size = (60, 80) if args.quick else (375, 500)
    if args.data is None:
        # The main job's cache: its default data set is this one, generated once for both.
        root = prepare_dataset(cache_dir=args.cache_dir, num_classes=10, images_per_class=args.images_per_class,
                               size=image_size)
    else:
        root = make_imagenet_like(args.data, num_classes=10, images_per_class=args.images_per_class, size=image_size)
    s, bs, nw = args.size, args.batch_size, args.workers
    paths = sorted(root.rglob("*.JPEG"))
    pil_ds = ImageFolder(root, transform=T.Compose([T.Resize((s, s)), T.PILToTensor()]))
    frame_ds = ImageFolder(root, loader=functools.partial(decode_image, size=(s, s)))
    # Batches made before the clock starts are not timed: skip the in-flight
    # depth (prefetch_factor 2 x workers), else a fast start counts as speed.
    warmup = max(2, 2 * nw)
    need = (args.batches + warmup) * bs

    def loader(cls: type, dataset: Any, **kwargs: Any) -> Any:
        # Shuffled as shuffle=True shuffles (RandomSampler), for as many
        # samples as the run needs: whole passes over the folder, then part of one.
        return cls(dataset, batch_size=bs, sampler=RandomSampler(dataset, num_samples=need), num_workers=nw,
                   drop_last=True, **kwargs)

    rows: list[dict[str, Any]] = []

    def add(key: str, name: str, rate: float) -> None:
        rows.append(dict(key=key, name=name, img_per_s=rate))
        print(f"  {key}. {name:<62} {rate:8.1f} img/s", flush=True)

    print(f"data: {root} ({len(paths)} images), workers={nw}, batch={bs}, size={s}, "
          f"cpus={os.cpu_count()}, torch threads={torch.get_num_threads()}")
    add("1", "DataLoader + PIL Resize + PILToTensor (processes)",
        _rate(loader(DataLoader, pil_ds), args.batches, bs, warmup))
    add("2", "ThreadDataLoader, same code", _rate(loader(ThreadDataLoader, pil_ds), args.batches, bs, warmup))
    add("2p", f"ThreadDataLoader, same code, worker_processes={procs}",
        _rate(loader(ThreadDataLoader, pil_ds, worker_processes=procs), args.batches, bs, warmup))
    add("3", "ThreadDataLoader + decode_image + frame_collate",
        _rate(loader(ThreadDataLoader, frame_ds, collate_fn=frame_collate), args.batches, bs, warmup))
    add("4", "DataLoader + decode_image + frame_collate (processes)",
        _rate(loader(DataLoader, frame_ds, collate_fn=frame_collate), args.batches, bs, warmup))
    secs = 0.3 if args.quick else 3.0
    prev = torch.get_num_threads()
    torch.set_num_threads(1)  # a single-thread kernel rate, as one worker process runs it
    try:
        # .numpy() runs the resize a frame leaves pending for collate: the kernel is decode + resize.
        one = _kernel_rate(paths, lambda q: decode_image(q, size=(s, s)).numpy(), secs)
        rrc_tv = T.RandomResizedCrop(s)
        tv = _kernel_rate(paths, lambda q: T.functional.pil_to_tensor(rrc_tv(Image_open_rgb(q))), secs)
        crop_loader = RandomResizedCropLoader(s)
        ours = _kernel_rate(paths, lambda q: crop_loader(q).numpy(), secs)
        full = _kernel_rate(paths, functools.partial(_full_decode_rrc, size=s), secs)
    finally:
        torch.set_num_threads(prev)
    # No more at once than the cores this process may use: past them, workers take turns.
    k = min(nw, usable_cores())
    add("5", f"kernel bound: {k} x single-thread decode_image(size) ({one:.0f}/s)", k * one)
    add("6a", "RandomResizedCrop, torchvision on PIL (1 thread)", tv)
    add("6b", "full decode_image + crop + resize (1 thread)", full)
    add("6c", "RandomResizedCropLoader, crop-aware decode (1 thread)", ours)

    r = {row["key"]: row["img_per_s"] for row in rows}
    print("ratios (target):")
    for a, b, target in [("3", "1", 2.0), ("2", "1", 1.0), ("2p", "1", 1.0), ("3", "5", 0.85), ("3", "4", 1.0), ("6c", "6a", None), ("6c", "6b", None)]:
        ratio = r[a] / r[b]
        rows.append(dict(key=f"{a}/{b}", name="ratio", img_per_s=ratio))
        goal = f"target {target:.2f}: {_verdict(ratio, target)}" if target else ""
        print(f"  {a}/{b}: {ratio:5.2f}  {goal}")
    return rows


def _verdict(ratio: float, target: float) -> str:
    """How a ratio compares with its target; below it is a measurement, not a failure."""
    if ratio >= target:
        return "reached"
    return "below (ratios move with the machine's load; rerun on a quiet machine)"


def Image_open_rgb(path: Path):  # noqa: N802 - torchvision's pil_loader, inlined
    from PIL import Image

    with open(path, "rb") as f:
        return Image.open(f).convert("RGB")


if __name__ == "__main__":
    main()
