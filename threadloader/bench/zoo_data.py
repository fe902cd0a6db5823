"""The workloads of ``python -m threadloader bench --zoo``: data sets users really run, generated small.

Each :class:`Workload` builds one map-style data set (picklable, so that
DataLoader's worker processes and ``worker_processes=P`` children can take
it) with its batch size and collate function. Every loader of the zoo reads
the same data set through the same sampler: only the loader differs.

The workloads, from GIL-bound to GIL-free:

* ``cifar-v1`` / ``cifar-v2``: 32x32 PIL images, ``RandomCrop(32, padding=4)``
  + ``RandomHorizontalFlip`` + ``ToTensor`` + ``Normalize`` (torchvision's
  ``transforms`` and ``transforms.v2``), batches of 128: per-sample Python;
* ``imagefolder-pil``: the main bench's baseline, ImageFolder + PIL
  ``Resize`` 224 + ``PILToTensor``, batches of 32;
* ``frames``: the same files through threadloader's frame path
  (``decode_image`` + ``frame_collate``);
* ``npy``: one ``.npy`` file per sample read with ``np.load``;
* ``json-tokenize``: a JSON line parsed and tokenized in a Python loop;
* ``torch-heavy``: a convolution and pooling per sample (the GIL released);
* ``trivial``: the index itself, unbatched (what the loader costs per item).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from threadloader.bench.data import default_cache_dir, prepare_dataset
from threadloader.bench.pipelines import frame_dataset, import_torchvision, torchvision_dataset

__all__ = [
    "CIFAR_MEAN",
    "CIFAR_STD",
    "SCALES",
    "WORKLOADS",
    "Scale",
    "Workload",
    "build_workload",
]

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


class Scale(NamedTuple):
    """How much data one zoo run generates and reads."""

    #: Samples held by the in-memory data sets (cycled when more are drawn).
    samples: int
    #: ImageFolder classes and images per class (generated, cached).
    classes: int
    per_class: int
    #: Side of the generated ImageFolder images (None: make_imagenet_like's default) and the output side.
    source_size: tuple[int, int] | None
    image_size: int
    #: Multiplies every workload's timed batches (at least one batch is timed).
    batches: float


SCALES: dict[str, Scale] = {
    "full": Scale(1024, 4, 32, None, 224, 1.0),
    "quick": Scale(512, 4, 16, None, 224, 0.5),
    "smoke": Scale(32, 2, 4, (48, 64), 32, 0.0),
}


class Workload(NamedTuple):
    """One row group of the zoo."""

    name: str
    #: What it stands for, one line.
    about: str
    #: ``None``: unbatched (the loader's own per-item cost).
    batch_size: int | None
    #: Timed batches (or items, unbatched) per cell at scale ``full``: about three seconds of
    #: DataLoader on 2 cores, so that the default's move into processes is timed with what follows it.
    batches: int
    build: Callable[[Scale, Path], tuple[Any, Callable[[list[Any]], Any] | None]]


# ----------------------------------------------------------------------------- data sets


def _cifar_images(n: int) -> np.ndarray:
    """``n`` 32x32 RGB uint8 images as CIFAR-10 holds them (N, H, W, C): smooth colour blobs plus noise."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:32, 0:32].astype(np.float32) / 32
    base = (np.sin(6 * xx + 3 * yy)[None, :, :, None] * rng.uniform(40, 120, (n, 1, 1, 3)) + 128)
    noise = rng.normal(0, 20, (n, 32, 32, 3))
    return np.clip(base + noise, 0, 255).astype(np.uint8)


class CifarLike(torch.utils.data.Dataset):
    """torchvision's CIFAR10 ``__getitem__``: ``Image.fromarray`` on the stored array, then the transform."""

    def __init__(self, n: int, transform: Any) -> None:
        self.data = _cifar_images(n)
        self.targets = [i % 10 for i in range(n)]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        from PIL import Image

        img = self.transform(Image.fromarray(self.data[index]))
        return img, self.targets[index]


def _cifar_v1(scale: Scale, cache: Path) -> tuple[Any, None]:
    t = import_torchvision().transforms
    transform = t.Compose([
        t.RandomCrop(32, padding=4), t.RandomHorizontalFlip(), t.ToTensor(), t.Normalize(CIFAR_MEAN, CIFAR_STD),
    ])
    return CifarLike(scale.samples, transform), None


def _cifar_v2(scale: Scale, cache: Path) -> tuple[Any, None]:
    import_torchvision()
    from torchvision.transforms import v2

    transform = v2.Compose([
        v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip(), v2.ToImage(),
        v2.ToDtype(torch.float32, scale=True), v2.Normalize(CIFAR_MEAN, CIFAR_STD),
    ])
    return CifarLike(scale.samples, transform), None


def _image_root(scale: Scale, cache: Path) -> Path:
    extra: dict[str, Any] = {"size": scale.source_size} if scale.source_size else {}
    return prepare_dataset(cache_dir=cache, num_classes=scale.classes, images_per_class=scale.per_class, **extra)


def _imagefolder_pil(scale: Scale, cache: Path) -> tuple[Any, None]:
    return torchvision_dataset(_image_root(scale, cache), scale.image_size, normalize=False), None


def _frames(scale: Scale, cache: Path) -> tuple[Any, Callable[[list[Any]], Any]]:
    from threadloader.images.frames import frame_collate

    return frame_dataset(_image_root(scale, cache), scale.image_size), frame_collate


class NpyFiles(torch.utils.data.Dataset):
    """One ``.npy`` file per sample (a CHW uint8 image), read with ``np.load``; the label from the index."""

    def __init__(self, files: list[Path]) -> None:
        self.files = [str(f) for f in files]

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.from_numpy(np.load(self.files[index])), index % 10


def _npy(scale: Scale, cache: Path) -> tuple[Any, None]:
    count = max(8, scale.samples // 4)
    side = 32 if scale.image_size < 64 else 128
    folder = cache / f"zoo-npy-{count}-{side}"
    files = [folder / f"{i}.npy" for i in range(count)]
    if not all(f.exists() for f in files):
        folder.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(1)
        for f in files:
            tmp = f.with_name(f"{f.stem}.{os.getpid()}.tmp.npy")
            np.save(tmp, rng.integers(0, 256, (3, side, side), dtype=np.uint8))
            os.replace(tmp, f)
    return NpyFiles(files), None


_WORDS = ("the a of to and in is was for on that with as by at from it an be this are or have "
          "which loader thread process batch image tensor worker sample sampler epoch seed random "
          "python parse token vocabulary sentence corpus model train data set fast slow core").split()


def _json_lines(n: int) -> list[str]:
    rng = np.random.default_rng(2)
    lines = []
    for i in range(n):
        words = [_WORDS[k] for k in rng.integers(0, len(_WORDS), 48)]
        text = " ".join(w.capitalize() if j % 9 == 0 else w for j, w in enumerate(words)) + "."
        lines.append(json.dumps({"id": i, "label": int(i % 5), "text": text, "meta": {"source": "zoo", "n": 48}}))
    return lines


class JsonTokenize(torch.utils.data.Dataset):
    """A JSON line parsed, its text lower-cased, split, stripped and mapped to ids in Python, padded to 64."""

    LENGTH = 64

    def __init__(self, n: int) -> None:
        self.lines = _json_lines(n)
        self.vocab = {w: i + 2 for i, w in enumerate(sorted(set(_WORDS)))}

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        record = json.loads(self.lines[index])
        ids = []
        for word in record["text"].lower().split():
            word = word.strip(".,;:!?")
            ids.append(self.vocab.get(word, 1))
        ids = ids[: self.LENGTH] + [0] * (self.LENGTH - len(ids))
        return torch.tensor(ids, dtype=torch.int64), record["label"]


class TorchHeavy(torch.utils.data.Dataset):
    """A 5x5 convolution (16 channels), ReLU and pooling of a stored 3x96x96 input: native work, the GIL released."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(3)
        self.inputs = torch.randn(min(n, 64), 3, 96, 96, generator=g)
        self.weight = torch.randn(16, 3, 5, 5, generator=g) / 8
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        x = self.inputs[index % len(self.inputs)].unsqueeze(0)
        y = torch.nn.functional.conv2d(x, self.weight, padding=2).relu_()
        y = torch.nn.functional.conv2d(y, self.weight.new_ones(16, 16, 3, 3) / 144, padding=1)
        return torch.nn.functional.adaptive_avg_pool2d(y, 12)[0], index % 10


class Trivial(torch.utils.data.Dataset):
    """The index itself: what remains is the loader's own cost per item."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


WORKLOADS: tuple[Workload, ...] = (
    Workload("cifar-v1", "32x32 PIL, RandomCrop+Flip+ToTensor+Normalize (transforms v1)", 128, 300, _cifar_v1),
    Workload("cifar-v2", "the same with transforms.v2", 128, 220, _cifar_v2),
    Workload("imagefolder-pil", "ImageFolder + PIL Resize 224 + PILToTensor", 32, 64, _imagefolder_pil),
    Workload("frames", "the same files, decode_image + frame_collate", 32, 100, _frames),
    Workload("npy", ".npy file per sample, np.load", 32, 1100, _npy),
    Workload("json-tokenize", "JSON line + Python tokenizer loop", 128, 1100, lambda s, c: (JsonTokenize(s.samples), None)),
    Workload("torch-heavy", "conv2d x2 + pooling per sample (GIL released)", 32, 190, lambda s, c: (TorchHeavy(s.samples), None)),
    Workload("trivial", "the index, unbatched (loader overhead)", None, 35000, lambda s, c: (Trivial(s.samples), None)),
)


def build_workload(
    workload: Workload, scale: Scale, cache_dir: str | os.PathLike[str] | None = None
) -> tuple[Any, Callable[[list[Any]], Any] | None]:
    """The data set and collate function of ``workload`` (``None``: the loader's default collate)."""
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    return workload.build(scale, cache)

