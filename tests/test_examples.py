"""Every example runs in smoke mode on tiny generated data and returns its rows."""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path
from types import ModuleType

import pytest
from helpers import require_torchvision

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load(relative: str) -> ModuleType:
    path = EXAMPLES / relative
    if "torchvision" in path.read_text():
        require_torchvision()
    name = "example_" + path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # process workers (fork) may pickle its classes
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tl-examples-cache")


def run(relative: str, cache_dir: Path, *extra: str) -> list[dict]:
    try:
        rows = load(relative).main(["--smoke", "--cache-dir", str(cache_dir), *extra])
    except ImportError as e:  # the bench's pipelines import torchvision when they build a loader
        if "torchvision" not in str(e):
            raise
        pytest.skip(f"torchvision unavailable: {e}")
    assert rows, relative
    return rows


@pytest.mark.parametrize(
    "relative", ["migration/step1_swap_import.py", "migration/step2_batching.py", "migration/step3_frames.py"]
)
def test_migration_steps(relative: str, cache_dir: Path, capsys: pytest.CaptureFixture) -> None:
    rows = run(relative, cache_dir, "--workers", "1,2")
    assert [(r["workers"], r["loader"]) for r in rows] == [
        (1, "DataLoader"), (1, "ThreadDataLoader"), (2, "DataLoader"), (2, "ThreadDataLoader")
    ]
    assert all(r["img/s"] > 0 for r in rows)
    assert all(r["ratio"] > 0 for r in rows if r["loader"] == "ThreadDataLoader")
    assert "ThreadDataLoader" in capsys.readouterr().out


def test_multi_thread_preprocessing(cache_dir: Path) -> None:
    import torch

    rows = run("multi_thread_preprocessing.py", cache_dir, "--workers", "1")
    assert len(rows) == (4 if torch.cuda.is_available() else 3) * 2
    assert {"config", "workers", "loader", "img/s", "ratio"} <= set(rows[0])


def test_data_formats(cache_dir: Path) -> None:
    mod = load("data_formats.py")
    rows = run("data_formats.py", cache_dir, "--workers", "1")
    assert [(r["format"], r["decoder"]) for r in rows[::2]] == list(mod.PAIRS)
    assert {r["loader"] for r in rows} == {"DataLoader", "ThreadDataLoader"}
    assert all(r["samples/s"] > 0 for r in rows)


def test_data_formats_loaders_agree(cache_dir: Path) -> None:
    mod = load("data_formats.py")
    files = mod.write_samples(cache_dir / "agree", 1, 16, 12)
    expected = mod.make_sample(0, 16, 12)
    for fmt, name in mod.PAIRS:
        sample = mod.DECODERS[(fmt, name)]([p.read_bytes() for p in files[fmt][0]])
        for key in ("image", "label"):
            assert (sample[key].numpy() == expected[key]).all(), (fmt, name, key)


@pytest.mark.parametrize("extra", [(), ("--source-size", "300x400")])
def test_decode_and_crop(cache_dir: Path, extra: tuple[str, ...]) -> None:
    rows = run("decode_and_crop.py", cache_dir, "--workers", "1", *extra)
    methods = {r["method"] for r in rows}
    assert len(methods) == 2
    assert all(r["img/s"] > 0 for r in rows)


def test_gpu_preprocessing(cache_dir: Path, capsys: pytest.CaptureFixture) -> None:
    import torch

    rows = run("gpu_preprocessing.py", cache_dir, "--workers", "1")
    assert [r["loader"] for r in rows] == ["DataLoader", "threads+cpu-normalize", "threads+to_device"]
    assert all(r["img/s"] > 0 for r in rows)
    if not torch.cuda.is_available():
        assert rows[0]["device"] == "cpu"
        assert "CPU fallback" in capsys.readouterr().out


def test_core_loader_benchmark(capsys: pytest.CaptureFixture) -> None:
    rows = load("core_loader_benchmark.py").main(["--smoke"])
    assert [r["config"] for r in rows] == ["unbatched", "batch 64"]
    for r in rows:
        assert r["dataloader_items_s"] > 0 and r["thread_items_s"] > 0
        assert r["speedup"] == pytest.approx(r["thread_items_s"] / r["dataloader_items_s"])
        assert r["floor_items_s"] > 0 and r["of_floor"] == pytest.approx(r["thread_items_s"] / r["floor_items_s"])
        assert r["floor_speedup"] == pytest.approx(r["floor_items_s"] / r["dataloader_items_s"])
    out = capsys.readouterr().out
    assert "speedup" in out and "unbatched" in out and "batch 64" in out and "of floor" in out and "floor x" in out


def test_core_loader_benchmark_floor_delivers_every_task_once() -> None:
    """The hand-off floor ends (no thread left waiting) after every task, also when fewer tasks than slots."""
    bench = load("core_loader_benchmark.py")
    before = threading.active_count()
    for n, workers, batch in [(5, 4, None), (640, 2, 64), (100, 3, None)]:
        assert bench.handoff_floor(n, workers, batch) > 0
    assert threading.active_count() == before


def test_core_loader_benchmark_worker_sweep() -> None:
    rows = load("core_loader_benchmark.py").main(["--smoke", "--workers", "1,3"])
    assert [(r["workers"], r["config"]) for r in rows] == [
        (1, "unbatched"), (1, "batch 64"), (3, "unbatched"), (3, "batch 64")]
    with pytest.raises(SystemExit):
        load("core_loader_benchmark.py").main(["--workers", "0,2"])


def test_free_threaded_benchmark(cache_dir: Path, capsys: pytest.CaptureFixture) -> None:
    rows = run("free_threaded_benchmark.py", cache_dir, "--workers", "1,2")
    assert [r["workers"] for r in rows] == [1, 2]
    assert rows[0]["ratio"] == 1.0 and rows[1]["ratio"] > 0
    assert {r["interpreter"] for r in rows} == {sys.executable}
    expect_gil = "on" if rows[0]["gil"] else "off"
    assert f" {expect_gil} " in capsys.readouterr().out


def test_free_threaded_benchmark_items_are_pure_python_and_deterministic() -> None:
    mod = load("free_threaded_benchmark.py")
    ds = mod.PythonRecords(10, fields=5)
    assert [ds[i] for i in range(10)] == [ds[i] for i in range(10)]
    assert len({ds[i] for i in range(10)}) > 1
