"""What a newcomer meets first: the bench's and the examples' figures and messages."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


class _Busy(torch.utils.data.Dataset):
    """Each item burns a few milliseconds of CPU in the worker."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> int:
        x = 0
        for i in range(60_000):
            x += i
        return index


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="usage is read from Linux /proc")
def test_worker_processes_that_end_inside_the_timed_part_still_count() -> None:
    # The epoch ends inside the timed part: DataLoader joins its worker
    # processes before the last reading. Their CPU time must stay counted.
    from threadloader.bench.measure import measure

    loader = torch.utils.data.DataLoader(_Busy(), batch_size=None, num_workers=2)
    m = measure(loader, max_items=None, warmup=8)
    assert m.timed_items == 16
    assert m.cpu_s is not None and m.cpu_s > 0
    assert m.page_faults is not None and m.page_faults >= 0


def _row(config: str, workers: int, loader: str, rate: float) -> dict:
    return {"config": config, "workers": workers, "loader": loader, "img/s": rate, "cores": None,
            "faults/img": None, "ratio": None, "note": ""}


def test_a_loader_above_the_kernel_bound_is_called_a_busy_machine() -> None:
    from threadloader.bench.report import bound_notes, summarize

    rows = [_row("2 +batching", 2, "DataLoader", 500.0), _row("2 +batching", 2, "ThreadDataLoader", 1200.0),
            _row("2 +batching", 2, "kernel bound", 1000.0), _row("3 +normalize", 2, "DataLoader", 400.0),
            _row("3 +normalize", 2, "ThreadDataLoader", 900.0), _row("3 +normalize", 2, "kernel bound", 1000.0)]
    notes = bound_notes(summarize(rows))
    assert len(notes) == 1
    assert "ThreadDataLoader (2 +batching) reached 1.20 of the kernel bound" in notes[0]
    assert "busier" in notes[0]


def test_speed_up_labels_clear_every_marker() -> None:
    # Two loaders peak at 2 workers just under another line's marker there:
    # no label may cover a marker or another label.
    pytest.importorskip("matplotlib")
    from threadloader.bench.report import build_figure

    rows = [_row("1 decode+resize", w, name, rate) for w, name, rate in [
        (1, "DataLoader", 400.0), (2, "DataLoader", 600.0),
        (1, "ThreadDataLoader", 700.0), (2, "ThreadDataLoader", 1000.0),
        (1, "DataLoader + kernel", 650.0), (2, "DataLoader + kernel", 990.0),
        (1, "kernel bound", 900.0), (2, "kernel bound", 1040.0)]]
    fig = build_figure(rows, {"batch_size": 32, "size": 224, "cores": 2, "device": "no GPU",
                              "python": "3.11", "torch": "2.14.1", "date": "2026-12-01"})
    ax = fig.axes[0]
    fig.canvas.draw()
    markers = [line.get_xydata() for line in ax.get_lines()]
    points = [ax.transData.transform(p) for xy in markers for p in xy]
    boxes = [t.get_window_extent() for t in ax.texts]
    assert len(boxes) == 2
    for box in boxes:
        for x, y in points:
            # a marker is about 6 points wide (about 8 px at 100 dpi)
            assert not (box.x0 - 4 < x < box.x1 + 4 and box.y0 - 4 < y < box.y1 + 4), (box, x, y)
    assert not boxes[0].overlaps(boxes[1])


def test_label_positions_skip_markers_and_each_other() -> None:
    from threadloader.bench.report import label_positions

    ys = label_positions([(2, 100.0), (2, 95.0)], {2: [100.0, 95.0, 104.0]}, height=5.0, marker=2.0)
    spans = [(y, y + 5.0) for y in ys]
    for low, high in spans:
        for m in (100.0, 95.0, 104.0):
            assert not (low < m + 2.0 and high > m - 2.0)
    assert spans[0][0] >= spans[1][1] or spans[1][0] >= spans[0][1]


def test_the_data_line_counts_the_files_left_out() -> None:
    from threadloader.bench.cli import _image_count

    assert _image_count(10, 10) == "10 images"
    assert _image_count(10, 8) == "10 images, 2 unreadable left out: 8 used"


def test_the_bench_says_how_many_images_it_left_out(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("torchvision")
    from threadloader.bench import main
    from threadloader.images.datagen import make_imagenet_like

    root = make_imagenet_like(tmp_path / "data", num_classes=2, images_per_class=5, size=(48, 64))
    for bad in (root / "class_000" / "0.JPEG", root / "class_001" / "1.JPEG"):
        bad.write_bytes(bad.read_bytes()[:200])
    main(["--root", str(root), "--smoke", "--skip-bad-files", "--no-progress", "--workers", "1",
          "--configs", "resize", "--batch-size", "2", "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert f"data: {root} (10 images, 2 unreadable left out: 8 used)" in out


def _load_example(relative: str):
    import importlib.util
    import sys

    path = Path(__file__).resolve().parents[1] / "examples" / relative
    name = "newcomer_" + path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_soak_help_needs_no_psutil(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil raises ImportError
    soak = _load_example("soak.py")
    with pytest.raises(SystemExit) as exc:
        soak.main(["--help"])
    assert exc.value.code == 0
    assert "--smoke" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="pip install psutil"):
        soak.main(["--smoke"])


def test_a_ratio_below_its_target_is_not_called_a_failure() -> None:
    pytest.importorskip("torchvision")
    example = _load_example("image_pipeline_benchmark.py")
    assert example._verdict(2.1, 2.0) == "reached"
    below = example._verdict(1.8, 2.0)
    assert below.startswith("below") and "MISSED" not in below and "load" in below


def test_the_image_pipeline_example_shares_the_main_jobs_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from threadloader.bench import data

    made = []
    monkeypatch.setattr("threadloader.images.datagen.make_imagenet_like", lambda root, **kw: made.append(Path(root)) or root)
    main_job = data.prepare_dataset(cache_dir=tmp_path, num_classes=10, images_per_class=100)
    example = data.prepare_dataset(cache_dir=tmp_path, num_classes=10, images_per_class=100,
                                   size=data.DEFAULT_IMAGE_SIZE)
    smaller = data.prepare_dataset(cache_dir=tmp_path, num_classes=10, images_per_class=100, size=(60, 80))
    assert main_job == example == tmp_path / "imagenet-like" / "10x100-seed0"
    assert smaller != main_job


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="usage is read from Linux /proc")
def test_migration_rows_never_show_negative_cores_or_faults(tmp_path: Path) -> None:
    # More batches than the folder holds: DataLoader's epoch ends, and its
    # worker processes are joined, inside the timed part.
    pytest.importorskip("torchvision")
    from threadloader.images.datagen import make_imagenet_like

    root = make_imagenet_like(tmp_path / "data", num_classes=2, images_per_class=16, size=(96, 128))
    step2 = _load_example("migration/step2_batching.py")
    rows = step2.main(["--root", str(root), "--workers", "2", "--batch-size", "2", "--max-batches", "30"])
    assert [r["loader"] for r in rows] == ["DataLoader", "ThreadDataLoader"]
    for row in rows:
        assert row["cores"] is None or row["cores"] >= 0, row
        assert row["faults/img"] is None or row["faults/img"] >= 0, row
