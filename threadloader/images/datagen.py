"""Deterministic, photo-like ImageNet stand-in data for tests and benchmarks.

Real photos have a roughly 1/f amplitude spectrum: most energy in smooth,
large-scale structure, a little fine detail. White noise is the opposite and
makes JPEG decoding unrealistically slow (entropy decoding dominates) and
files unrealistically large, so benchmarks on it mislead. Here an image is a
sum of octaves of low-resolution Gaussian noise, each upsampled bicubically
with amplitude falling with frequency, plus a pinch of pixel-level grain.
Everything is vectorised in torch/NumPy; encoding goes through simplejpeg.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["make_imagenet_like", "photo_like_image"]

_MARKER = ".threadloader-imagenet-like.json"
_FORMAT_VERSION = 1
_DECAY = 0.95  # amplitude ratio between successive octaves
_CONTRAST = 60.0  # standard deviation of the smooth part, in levels


def photo_like_image(height: int, width: int, seed: int | np.random.Generator = 0, *, grain: float = 3.0) -> np.ndarray:
    """A smooth, photo-like RGB image.

    Args:
        height: image height in pixels.
        width: image width in pixels.
        seed: seed or NumPy generator; the same seed gives the same pixels.
        grain: standard deviation (in levels) of the per-pixel grain; it
            controls JPEG file size (larger = more bytes).

    Returns:
        ``(height, width, 3)`` uint8 array, C-contiguous.
    """
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    # Pyramid synthesis: start from a ~3-cell grid and repeatedly double the
    # resolution, adding a fresh noise octave each time with amplitude falling
    # by ``_DECAY`` per octave (a 1/f-like spectrum). Each step upsamples the
    # running sum once, so the cost is about two full-resolution passes.
    grids = [(height, width)]
    while min(grids[-1]) > 3:
        gh, gw = grids[-1]
        grids.append(((gh + 1) // 2, (gw + 1) // 2))
    grids.reverse()  # coarse to fine; the finest octave is full resolution
    acc = torch.zeros(1, 3, *grids[0])
    amp, power = 1.0, 0.0
    for gh, gw in grids:
        if acc.shape[-2:] != (gh, gw):
            acc = torch.nn.functional.interpolate(acc, size=(gh, gw), mode="bilinear", align_corners=False)
        lum = rng.standard_normal((1, gh, gw), dtype=np.float32)
        chroma = rng.standard_normal((3, gh, gw), dtype=np.float32) * 0.4
        acc += amp * torch.from_numpy(lum + chroma)[None]  # correlated channels, like photos
        power += amp * amp
        amp *= _DECAY
    mean = torch.from_numpy(rng.uniform(70, 170, size=(1, 3, 1, 1)).astype(np.float32))
    img = (mean + acc * (_CONTRAST / float(np.sqrt(power))))[0].permute(1, 2, 0).numpy()
    if grain > 0:
        img += rng.standard_normal(img.shape, dtype=np.float32) * grain
    return np.ascontiguousarray(np.clip(img + 0.5, 0, 255).astype(np.uint8))


def _image_size(rng: np.random.Generator, size: tuple[int, int]) -> tuple[int, int]:
    # ImageNet: about half the images are exactly 500x375 landscape, many are
    # portrait 375x500, some square, the rest spread in size and aspect.
    h, w = size
    u = rng.random()
    if u < 0.5:
        return h, w
    if u < 0.65:
        return w, h
    if u < 0.75:
        s = min(h, w)
        return s, s
    aspect = float(np.exp(rng.uniform(np.log(0.6), np.log(1.7))))  # width / height
    area = h * w * float(rng.uniform(0.6, 1.4))
    hh = int(round(np.sqrt(area / aspect)))
    ww = int(round(np.sqrt(area * aspect)))
    return max(16, hh), max(16, ww)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)  # readers never see a half-written file


def make_imagenet_like(
    root: str | os.PathLike,
    *,
    num_classes: int = 10,
    images_per_class: int = 100,
    seed: int = 0,
    size: tuple[int, int] = (375, 500),
    quality: int = 90,
    grain: float = 3.0,
    progress: bool = False,
) -> Path:
    """Generate (once) an ImageFolder tree ``root/<class>/<i>.JPEG`` of photo-like JPEGs.

    Sizes vary around ``size`` like ImageNet's (half exactly ``size``, some
    portrait, some square, the rest scattered); with the defaults the mean
    file is about 110 KB, close to ImageNet's. Generation is deterministic in
    all parameters. A marker file records the parameters; a later call with
    the same parameters returns at once, other parameters regenerate.

    Args:
        root: directory to fill (created if needed).
        num_classes: number of class directories (``class_000`` ...).
        images_per_class: JPEGs per class (``0.JPEG`` ...).
        seed: base seed.
        size: typical ``(height, width)``; ImageNet's most common is 375x500.
        quality: JPEG quality (4:2:0 subsampling).
        grain: per-pixel grain (levels); tunes file size.
        progress: when generating, say on stderr where the data goes and how
            to remove it, and show a progress bar (tqdm, when installed).

    Returns:
        ``Path(root)``, ready for ``torchvision.datasets.ImageFolder``.
    """
    from ._codec import jpeg

    root = Path(root).expanduser()
    params = dict(
        version=_FORMAT_VERSION, num_classes=num_classes, images_per_class=images_per_class,
        seed=seed, size=list(size), quality=quality, grain=grain,
    )
    marker = root / _MARKER
    try:
        if json.loads(marker.read_text()) == params:
            return root
    except (OSError, ValueError):
        pass
    root.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    total = num_classes * images_per_class
    if progress:
        mb = total * 0.11 * (size[0] * size[1]) / (375 * 500)
        print(
            f"generating {total} ImageNet-like JPEGs (about {mb:.0f} MB, once) in {root}\n"
            f"  to free the space later: rm -r {shlex.quote(str(root))}  (set THREADLOADER_CACHE to keep them elsewhere)",
            file=sys.stderr, flush=True,
        )
    bar = _bar(total if progress else 0)
    for stale in root.glob("class_*"):
        # Class directories of an earlier, larger tree would become classes.
        if stale.is_dir() and not (stale.name[6:].isdigit() and int(stale.name[6:]) < num_classes):
            for f in stale.glob("*.JPEG"):
                f.unlink()
            try:
                stale.rmdir()
            except OSError:
                pass  # holds files we did not make; leave them
    for c in range(num_classes):
        cdir = root / f"class_{c:03d}"
        cdir.mkdir(exist_ok=True)
        for old in cdir.glob("*.JPEG"):
            if not old.stem.isdigit() or int(old.stem) >= images_per_class:
                old.unlink()  # leftovers from a larger earlier tree
        for i in range(images_per_class):
            rng = np.random.default_rng([seed, c, i])
            h, w = _image_size(rng, size)
            pixels = photo_like_image(h, w, rng, grain=grain)
            data = jpeg.encode_jpeg(pixels, quality=quality, colorspace="RGB", colorsubsampling="420")
            _write_atomic(cdir / f"{i}.JPEG", data)
            bar.update(1)
    bar.close()
    _write_atomic(marker, json.dumps(params).encode())
    return root


class _NoBar:
    def update(self, n: int = 1) -> None: ...
    def close(self) -> None: ...


def _bar(total: int) -> Any:
    """A tqdm bar on stderr for ``total`` images (nothing when 0 or tqdm is missing)."""
    if not total:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is an optional extra
        return _NoBar()
    return tqdm(total=total, desc="generating", unit="img", file=sys.stderr, dynamic_ncols=True, leave=False)
