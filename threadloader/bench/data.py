"""The bench's data: the generated ImageNet-like folder, or the user's ``--root``, checked."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "BenchError",
    "AllowedFiles",
    "IMAGE_EXTENSIONS",
    "default_cache_dir",
    "find_bad_files",
    "image_files",
    "image_problem",
    "prepare_dataset",
]

#: ImageFolder's extensions (torchvision's ``IMG_EXTENSIONS``), compared case-insensitively.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


#: ``datagen.make_imagenet_like``'s typical image size, ImageNet's most common one.
DEFAULT_IMAGE_SIZE = (375, 500)


class BenchError(Exception):
    """An expected problem with the bench's input or output, told in one line (no traceback)."""


def default_cache_dir() -> Path:
    """Where generated data sets live: ``$THREADLOADER_CACHE`` or ``~/.cache/threadloader``."""
    env = os.environ.get("THREADLOADER_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "threadloader"


def image_files(root: str | os.PathLike[str]) -> list[Path]:
    """The files ImageFolder would load from ``root`` (``root/<class>/**/<image>``), sorted."""
    root = Path(root)
    files = []
    for cls in sorted(p for p in root.iterdir() if p.is_dir()):
        for dirpath, _, names in sorted(os.walk(cls, followlinks=True)):
            files += [Path(dirpath, n) for n in sorted(names) if n.lower().endswith(IMAGE_EXTENSIONS)]
    return files


def image_problem(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` cannot be decoded, or None when it looks whole. Cheap: no full decode.

    JPEGs: the header parses and an end-of-image marker follows the last scan
    (what :func:`threadloader.io.decode_image` checks to refuse truncation).
    Other formats: Pillow identifies and verifies the file.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    if not data:
        return "empty file"
    if data[:2] == b"\xff\xd8":
        from ..images._codec import jpeg

        try:
            jpeg.decode_jpeg_header(data)
        except ValueError as e:
            return f"corrupt JPEG header ({e})"
        if data.rfind(b"\xff\xd9") <= data.rfind(b"\xff\xda"):
            return "truncated JPEG (no end-of-image marker after the scan)"
        return None
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            im.verify()
    except Exception as e:  # noqa: BLE001 - Pillow raises many types for bad data
        return f"not an image Pillow can read ({type(e).__name__}: {e})"
    return None


def find_bad_files(files: Iterable[Path], *, progress: bool = False) -> list[tuple[Path, str]]:
    """``(path, reason)`` for every file in ``files`` that :func:`image_problem` refuses."""
    from threadloader.bench.report import progress_bar

    files = list(files)
    bad = []
    with progress_bar(len(files), progress, desc="checking images", unit="img") as bar:
        for path in files:
            problem = image_problem(path)
            if problem is not None:
                bad.append((path, problem))
            bar.update(1)
    return bad


class AllowedFiles:
    """ImageFolder ``is_valid_file`` accepting exactly a given set of paths (picklable)."""

    def __init__(self, files: Iterable[str | os.PathLike[str]]) -> None:
        self.files = frozenset(os.path.abspath(f) for f in files)

    def __call__(self, path: str) -> bool:
        return os.path.abspath(path) in self.files


def prepare_dataset(
    root: str | os.PathLike[str] | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    num_classes: int = 10,
    images_per_class: int = 100,
    seed: int = 0,
    progress: bool = False,
    **kwargs: Any,
) -> Path:
    """Return an ImageFolder-style root: ``root`` itself, or a generated one.

    Args:
        root: the user's own folder (``class/image.jpg``); when given, nothing
            is generated.
        cache_dir: parent of generated data sets (default :func:`default_cache_dir`).
        num_classes: classes to generate.
        images_per_class: images per class to generate.
        seed: generator seed (the data set is deterministic and cached).
        progress: when generating, say where and show a progress bar (stderr).
        **kwargs: passed to ``make_imagenet_like``.

    Returns:
        The root folder.

    Raises:
        FileNotFoundError: if ``root`` is given but is not a directory.
    """
    if root is not None:
        path = Path(root).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"data root {str(path)!r} is not a directory")
        return path
    from threadloader.images.datagen import make_imagenet_like

    base = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    # One folder per shape of data set, so quick/smoke/full runs never regenerate each other's.
    # The default image size is left out of the name: every caller asking for
    # the same set (the main job, the image pipeline example) shares one copy.
    name = f"{num_classes}x{images_per_class}-seed{seed}"
    if "size" in kwargs and tuple(kwargs["size"]) != DEFAULT_IMAGE_SIZE:
        name += "-{}x{}".format(*kwargs["size"])
    target = base / "imagenet-like" / name
    return Path(
        make_imagenet_like(
            target, num_classes=num_classes, images_per_class=images_per_class, seed=seed,
            progress=progress, **kwargs,
        )
    )
