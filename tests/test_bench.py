"""Tests for the bench (python -m threadloader bench) and its helpers."""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from threadloader import bench

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tl-cache")


def test_parse_workers() -> None:
    assert bench.parse_workers("4,1,2,2") == [1, 2, 4]
    for bad in ("", "0", "a,b", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.parse_workers(bad)


def test_default_workers_capped() -> None:
    assert bench.default_workers(2) == [1, 2]
    assert bench.default_workers(6) == [1, 2, 4, 6]
    assert bench.default_workers(64) == [1, 2, 4, 8, 16]


def test_count_images() -> None:
    assert bench.count_images((torch.zeros(5, 3, 2, 2), torch.zeros(5))) == 5
    assert bench.count_images({"image": torch.zeros(3, 3, 2, 2)}) == 3
    assert bench.count_images((torch.zeros(3, 2, 2), 1)) == 1


def test_measure_skips_warmup_and_stops() -> None:
    batches = [(torch.zeros(4, 3, 2, 2), torch.zeros(4))] * 10
    m = bench.measure(batches, max_items=6, warmup=2)
    assert m.images == 16  # items 3..6 are timed
    assert m.first_batch_s >= 0 and m.seconds > 0
    short = bench.measure(batches[:1], warmup=2)  # too short to skip: all timed
    assert short.images == 4


def test_format_table_and_ratios() -> None:
    rows = [
        {"config": "c", "workers": 1, "loader": "DataLoader", "img/s": 100.0},
        {"config": "c", "workers": 1, "loader": "ThreadDataLoader", "img/s": 250.0},
    ]
    for r in rows:
        r["ratio"] = None
    bench._add_ratios(rows)
    assert rows[1]["ratio"] == 2.5 and rows[0]["ratio"] is None
    text = bench.format_table(rows)
    assert text.splitlines()[0].split() == ["config", "workers", "loader", "img/s", "ratio"]
    assert "2.5" in text and len(text.splitlines()) == 4
    summary = bench.summarize(rows)
    assert summary[0]["ratio"] == 2.5


def test_prepare_dataset_missing_root(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        bench.prepare_dataset(tmp_path / "missing")


def test_build_loader_rejects_unknown() -> None:
    with pytest.raises(ValueError):
        bench.build_loader("DataLoader", "nope", ".", workers=1)
    with pytest.raises(ValueError):
        bench.build_loader("Nope", "batch", ".", workers=1)


def test_bench_smoke_writes_outputs(tmp_path: Path, cache_dir: Path) -> None:
    out = tmp_path / "out"
    rows = bench.main(["--smoke", "--out", str(out), "--cache-dir", str(cache_dir), "--no-progress"])
    configs = 4 if torch.cuda.is_available() else 3
    assert len(rows) == configs * 2 * 2  # configs x workers 1,2 x two loaders
    assert {r["loader"] for r in rows} == set(bench.LOADERS)
    assert all(r["img/s"] > 0 and r["images"] > 0 for r in rows)
    assert all(r["ratio"] > 0 for r in rows if r["loader"] == "ThreadDataLoader")
    with (out / "results.csv").open() as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == bench.COLUMNS
        assert len(list(reader)) == len(rows)
    assert (out / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "measured" in (out / "bench.log").read_text()


def test_bench_own_root_and_subset(tmp_path: Path, cache_dir: Path) -> None:
    root = bench.prepare_dataset(cache_dir=cache_dir, num_classes=2, images_per_class=8, size=(96, 128))
    rows = bench.main(
        ["--smoke", "--root", str(root), "--out", str(tmp_path), "--configs", "batch", "--workers", "2", "--no-progress"]
    )
    assert [(r["config"], r["workers"]) for r in rows] == [(bench.CONFIGS["batch"], 2)] * 2


def test_cli_help_version_and_smoke(tmp_path: Path, cache_dir: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "threadloader", *args], capture_output=True, text=True, cwd=ROOT, timeout=120
        )

    helped = cli("bench", "--help")
    assert helped.returncode == 0 and "--quick" in helped.stdout and "--root" in helped.stdout
    version = cli("--version")
    assert version.returncode == 0 and "threadloader" in version.stdout
    ran = cli("bench", "--smoke", "--configs", "resize", "--workers", "1", "--out", str(tmp_path), "--cache-dir", str(cache_dir))
    assert ran.returncode == 0, ran.stderr
    assert "ThreadDataLoader" in ran.stdout and (tmp_path / "results.csv").exists()
