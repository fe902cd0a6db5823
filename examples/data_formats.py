"""Serialized samples: which format and which loader, in threads or processes.

Each sample is an RGB image (uint8, 3x640x480) and an integer label map
(int64, 640x480), stored four ways: a torch state dict (``torch.save``), two
NPY files, an NPZ and a compressed NPZ. They are read back with the usual
loaders (``torch.load`` / ``np.load`` on a ``BytesIO``) and with threadloader's
``load_npy`` / ``load_npz``, which return zero-copy views of the bytes already
read instead of copying them again (compressed NPZ must still inflate).

The lessons:

* in worker *processes* every batch is copied into shared memory and sent to
  the main process; threads hand over the batch object itself, so big samples
  favour threads;
* copies matter once I/O is cheap: a zero-copy loader saves one full pass over
  the bytes per sample;
* compression trades CPU for bytes: ``zlib`` releases the GIL while it
  inflates, so it still scales with threads.

Run: ``python examples/data_formats.py [--smoke] [--workers 1,2] [--cache-dir DIR]``
"""

from __future__ import annotations

import argparse
import io
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate

from threadloader import ThreadDataLoader
from threadloader.bench import compare_loaders, default_cache_dir, default_workers, format_table, parse_workers
from threadloader.images.datagen import photo_like_image

FORMATS = ("torch", "npy", "npz", "npz-compressed")
#: (format, loader name) pairs measured.
PAIRS = (
    ("torch", "torch.load"),
    ("npy", "np.load"),
    ("npy", "load_npy"),
    ("npz", "np.load"),
    ("npz", "load_npz"),
    ("npz-compressed", "np.load"),
    ("npz-compressed", "load_npz"),
)


def make_sample(seed: int, height: int, width: int) -> dict[str, np.ndarray]:
    """One sample: a photo-like CHW uint8 image and a blocky int64 label map."""
    image = np.ascontiguousarray(photo_like_image(height, width, seed).transpose(2, 0, 1))
    rng = np.random.default_rng(seed)
    # Coarse regions, like a segmentation map: compressible, as real ones are.
    coarse = rng.integers(0, 21, size=(max(1, height // 32), max(1, width // 32)))
    label = np.kron(coarse, np.ones((32, 32), dtype=np.int64))[:height, :width]
    label = np.pad(label, ((0, height - label.shape[0]), (0, width - label.shape[1])), mode="edge")
    return {"image": image, "label": np.ascontiguousarray(label, dtype=np.int64)}


def write_samples(directory: Path, count: int, height: int, width: int) -> dict[str, list[list[Path]]]:
    """Write ``count`` samples in every format (once; reused when present).

    Returns:
        format -> per sample, the list of its files (NPY: one per array).
    """
    files: dict[str, list[list[Path]]] = {f: [] for f in FORMATS}
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        paths = {
            "torch": [directory / f"{i}.pt"],
            "npy": [directory / f"{i}.image.npy", directory / f"{i}.label.npy"],
            "npz": [directory / f"{i}.npz"],
            "npz-compressed": [directory / f"{i}.compressed.npz"],
        }
        if not all(p.exists() for ps in paths.values() for p in ps):
            sample = make_sample(i, height, width)
            tensors = {k: torch.from_numpy(v) for k, v in sample.items()}
            blobs = {
                paths["torch"][0]: _torch_bytes(tensors),
                paths["npy"][0]: _npy_bytes(sample["image"]),
                paths["npy"][1]: _npy_bytes(sample["label"]),
                paths["npz"][0]: _npz_bytes(sample, compressed=False),
                paths["npz-compressed"][0]: _npz_bytes(sample, compressed=True),
            }
            for path, data in blobs.items():
                tmp = path.with_suffix(path.suffix + ".tmp")
                tmp.write_bytes(data)
                tmp.replace(path)  # atomic: a killed run never leaves half a file
        for f in FORMATS:
            files[f].append(paths[f])
    return files


def _torch_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _npz_bytes(arrays: dict[str, np.ndarray], compressed: bool) -> bytes:
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **arrays)
    return buf.getvalue()


# -- decoders: bytes of a sample's files -> {"image": tensor, "label": tensor} ---------


def _as_tensors(arrays: Any) -> dict[str, torch.Tensor]:
    # torch.from_numpy shares memory; read-only views (zero-copy loaders) are
    # never written to, so torch's "not writable" warning does not apply here.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not writable.*")
        return {k: torch.from_numpy(np.asarray(arrays[k])) for k in ("image", "label")}


def decode_torch_load(blobs: list[bytes]) -> dict[str, torch.Tensor]:
    return torch.load(io.BytesIO(blobs[0]), weights_only=True)


def decode_np_load_npy(blobs: list[bytes]) -> dict[str, torch.Tensor]:
    return _as_tensors({"image": np.load(io.BytesIO(blobs[0])), "label": np.load(io.BytesIO(blobs[1]))})


def decode_load_npy(blobs: list[bytes]) -> dict[str, torch.Tensor]:
    from threadloader.io import load_npy

    return _as_tensors({"image": load_npy(blobs[0]), "label": load_npy(blobs[1])})


def decode_np_load_npz(blobs: list[bytes]) -> dict[str, torch.Tensor]:
    with np.load(io.BytesIO(blobs[0])) as z:
        return _as_tensors({k: z[k] for k in z.files})


def decode_load_npz(blobs: list[bytes]) -> dict[str, torch.Tensor]:
    from threadloader.io import load_npz

    return _as_tensors(load_npz(blobs[0]))


DECODERS: dict[tuple[str, str], Callable[[list[bytes]], dict[str, torch.Tensor]]] = {
    ("torch", "torch.load"): decode_torch_load,
    ("npy", "np.load"): decode_np_load_npy,
    ("npy", "load_npy"): decode_load_npy,
    ("npz", "np.load"): decode_np_load_npz,
    ("npz", "load_npz"): decode_load_npz,
    ("npz-compressed", "np.load"): decode_np_load_npz,
    ("npz-compressed", "load_npz"): decode_load_npz,
}


class SerializedDataset(Dataset):
    """Reads one sample's files and decodes them; ``length`` cycles over the files."""

    def __init__(self, files: list[list[Path]], decoder: Callable[[list[bytes]], Any], length: int) -> None:
        self.files, self.decoder, self.length = files, decoder, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        paths = self.files[index % len(self.files)]
        return self.decoder([p.read_bytes() for p in paths])


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Measure every (format, loader) in threads and in processes; print and return rows."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-dir", help="where the samples are written (default: $THREADLOADER_CACHE or ~/.cache/threadloader)")
    parser.add_argument("--workers", type=parse_workers, help="worker counts (default: 1,2,4,8,16 capped at the cores)")
    parser.add_argument("--batch-size", type=int, default=8, help="samples per batch (default 8)")
    parser.add_argument("--max-batches", type=int, default=8, help="timed batches per run (default 8)")
    parser.add_argument("--samples", type=int, default=16, help="distinct samples on disk (default 16)")
    parser.add_argument("--smoke", action="store_true", help="tiny samples, a few seconds")
    args = parser.parse_args(argv)
    height, width = (64, 48) if args.smoke else (640, 480)
    count = 4 if args.smoke else args.samples
    batch_size = 2 if args.smoke else args.batch_size
    max_batches = 2 if args.smoke else args.max_batches
    workers = args.workers or ([1, 2] if args.smoke else default_workers())
    base = Path(args.cache_dir).expanduser() if args.cache_dir else default_cache_dir()
    files = write_samples(base / "data-formats" / f"{count}x3x{height}x{width}", count, height, width)

    rows: list[dict[str, Any]] = []
    length = (max_batches + 1) * batch_size
    for fmt, name in PAIRS:
        dataset = SerializedDataset(files[fmt], DECODERS[(fmt, name)], length)
        kwargs = {"batch_size": batch_size, "collate_fn": default_collate}
        loaders = {
            "DataLoader": lambda w: torch.utils.data.DataLoader(dataset, num_workers=w, **kwargs),
            "ThreadDataLoader": lambda w: ThreadDataLoader(dataset, num_workers=w, **kwargs),
        }
        for row in compare_loaders(loaders, workers, max_items=max_batches + 1, warmup=1):
            mb = sum(p.stat().st_size for p in files[fmt][0]) / 1e6
            rows.append(
                {
                    "format": fmt,
                    "decoder": name,
                    "loader": row["loader"],
                    "workers": row["workers"],
                    "samples/s": row["img/s"],
                    "MB/sample": round(mb, 3),
                    "ratio": row["ratio"],
                }
            )
    print(format_table(rows))
    return rows


if __name__ == "__main__":
    main()
