"""make_imagenet_like: deterministic, cached, photo-like ImageFolder trees."""

from __future__ import annotations

import numpy as np
import pytest

from threadloader.images._codec import jpeg
from threadloader.images.datagen import make_imagenet_like, photo_like_image


def _tree(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.JPEG"))


def test_layout_determinism_and_cache(tmp_path) -> None:
    a = make_imagenet_like(tmp_path / "a", num_classes=3, images_per_class=4, size=(48, 64), seed=1)
    b = make_imagenet_like(tmp_path / "b", num_classes=3, images_per_class=4, size=(48, 64), seed=1)
    assert _tree(a) == _tree(b) == [f"class_{c:03d}/{i}.JPEG" for c in range(3) for i in range(4)]
    for rel in _tree(a):
        assert (a / rel).read_bytes() == (b / rel).read_bytes()
    # Cached: an identical call does not rewrite files.
    stamp = (a / "class_000/0.JPEG").stat().st_mtime_ns
    make_imagenet_like(a, num_classes=3, images_per_class=4, size=(48, 64), seed=1)
    assert (a / "class_000/0.JPEG").stat().st_mtime_ns == stamp
    # Other parameters regenerate, dropping what no longer belongs.
    make_imagenet_like(a, num_classes=2, images_per_class=2, size=(48, 64), seed=2)
    assert _tree(a) == [f"class_{c:03d}/{i}.JPEG" for c in range(2) for i in range(2)]
    assert (a / "class_000/0.JPEG").read_bytes() != (b / "class_000/0.JPEG").read_bytes()


def test_sizes_vary_like_imagenet(tmp_path) -> None:
    root = make_imagenet_like(tmp_path, num_classes=2, images_per_class=20, size=(75, 100))
    sizes = [jpeg.decode_jpeg_header(p.read_bytes())[:2] for p in root.rglob("*.JPEG")]
    assert sizes.count((75, 100)) >= 10
    assert (100, 75) in sizes
    assert len(set(sizes)) >= 4


def test_photo_like_is_smooth_not_noise() -> None:
    img = photo_like_image(120, 160, 0).astype(np.float32)
    assert img.shape == (120, 160, 3)
    assert np.array_equal(photo_like_image(120, 160, 0), photo_like_image(120, 160, 0))
    # Neighbouring pixels are strongly correlated (white noise would be ~0).
    a, b = img[:, :-1].ravel() - img.mean(), img[:, 1:].ravel() - img.mean()
    assert np.corrcoef(a, b)[0, 1] > 0.7
    assert img.std() > 15  # and it is not flat


def test_default_file_size_is_imagenet_like(tmp_path) -> None:
    # A few full-size images: mean JPEG size near ImageNet's ~110 KB.
    root = make_imagenet_like(tmp_path, num_classes=1, images_per_class=6)
    sizes = [p.stat().st_size for p in root.rglob("*.JPEG")]
    assert 60_000 < np.mean(sizes) < 170_000


def test_image_pipeline_benchmark_smoke(tmp_path) -> None:
    import importlib.util
    from pathlib import Path

    from helpers import require_torchvision

    require_torchvision()
    path = Path(__file__).resolve().parents[1] / "examples" / "image_pipeline_benchmark.py"
    spec = importlib.util.spec_from_file_location("image_pipeline_benchmark", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.main(["--smoke", "--data", str(tmp_path / "data")])
    keys = {r["key"] for r in rows}
    assert {"1", "2", "2p", "3", "4", "5", "3/1", "2p/1", "3/5"} <= keys
    assert all(r["img_per_s"] > 0 for r in rows)
    assert "worker_processes=1" in next(r["name"] for r in rows if r["key"] == "2p")
    with pytest.raises(SystemExit):  # argparse: one line on stderr, status 2
        mod.main(["--quick", "--workers", "2", "--worker-processes", "3"])
    # Batches made before timing starts are never timed: every loader skips its
    # in-flight depth (2 x 6 workers), and the samplers cycle over the 40 images.
    warmups = []
    real_rate = mod._rate

    def rate(loader, batches, batch_size, warmup=2):
        warmups.append(warmup)
        return real_rate(loader, batches, batch_size, warmup)

    mod._rate = rate
    rows = mod.main(["--quick", "--data", str(tmp_path / "data"), "--workers", "6", "--worker-processes", "2"])
    assert warmups == [12] * 5 and all(r["img_per_s"] > 0 for r in rows)


def test_generation_says_where_and_how_to_remove(tmp_path, capsys) -> None:
    root = make_imagenet_like(tmp_path / "d", num_classes=1, images_per_class=2, size=(32, 48), progress=True)
    err = capsys.readouterr().err
    assert str(root) in err and f"rm -r {root}" in err and "THREADLOADER_CACHE" in err
    make_imagenet_like(tmp_path / "d", num_classes=1, images_per_class=2, size=(32, 48), progress=True)
    assert capsys.readouterr().err == ""  # cached: nothing generated, nothing said
