"""Tests for the bench (python -m threadloader bench): flags, error paths, measuring, report, plot."""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import require_torchvision
from hypothesis import given
from hypothesis import strategies as st

from threadloader import bench
from threadloader.__main__ import main as cli_main
from threadloader.bench import cli, data, pipelines, report

# The module, not the function of the same name that the package re-exports.
measure = importlib.import_module("threadloader.bench.measure")
kernel_bound = importlib.import_module("threadloader.bench.kernel_bound")
python_time = importlib.import_module("threadloader.bench.python_time")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tl-cache")


@pytest.fixture(scope="session")
def small_root(cache_dir: Path) -> Path:
    """16 tiny JPEGs in 2 classes (the --smoke data)."""
    return bench.prepare_dataset(cache_dir=cache_dir, num_classes=2, images_per_class=8, size=(96, 128))


def copy_root(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".threadloader*"))
    return dst


def fails(argv: list[str], capsys: pytest.CaptureFixture, status: int = 1) -> str:
    """Run the bench in-process, expect SystemExit(status); return stderr, checked to be one error line."""
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == status
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err
    return errors[0]


# ----------------------------------------------------------------------------- flags


@pytest.mark.parametrize(
    "flag, value, says",
    [
        ("--workers", "0", "positive"),
        ("--workers", "a,b", "1,2,4"),
        ("--workers", "2,100000", "usable cores"),
        ("--batch-size", "0", "positive integer"),
        ("--batch-size", "-3", "positive integer"),
        ("--batch-size", "x", "positive integer"),
        ("--max-batches", "-1", "positive integer"),
        ("--max-batches", "0", "positive integer"),
        ("--warmup", "-5", ">= 0"),
        ("--size", "0", "positive integer"),
        ("--size", "100000", "at most"),
        ("--worker-processes", "0", "positive integer"),
        ("--configs", "nope", "unknown config"),
        ("--configs", ",", "unknown config"),
        ("--device", "nodevice", "not a torch device"),
    ],
)
def test_bad_numbers_and_names_are_refused_at_parse_time(flag, value, says, capsys, tmp_path) -> None:
    line = fails([flag, value, "--out", str(tmp_path / "out")], capsys, status=2)
    assert flag in line and says in line
    assert not (tmp_path / "out").exists()  # refused before any work


def test_flag_types_accept_good_values() -> None:
    assert cli.positive_int("3") == 3 and cli.non_negative_int("0") == 0
    assert bench.parse_workers("4,1,2,2") == [1, 2, 4]
    assert cli.parse_configs("normalize,batch") == ["batch", "normalize"]
    with pytest.raises(argparse.ArgumentTypeError):
        cli.non_negative_int("-1")


def test_worker_counts_go_to_twice_the_cores() -> None:
    assert bench.bench_workers(2) == [1, 2, 4]
    assert bench.bench_workers(6) == [1, 2, 4, 6, 8, 12]
    assert bench.bench_workers(16) == [1, 2, 4, 8, 16, 32]
    assert bench.default_workers(6) == [1, 2, 4, 6]  # the examples' default is unchanged
    assert pipelines.worker_processes_for(16) == 4
    assert pipelines.worker_processes_for(2) == 1
    assert pipelines.worker_processes_for(8, 3) == 3


# ----------------------------------------------------------------------------- expected errors


def test_missing_root(capsys, tmp_path) -> None:
    line = fails(["--root", str(tmp_path / "nope"), "--out", str(tmp_path / "out")], capsys)
    assert "is not a folder" in line


def test_empty_root(capsys, tmp_path) -> None:
    (tmp_path / "root" / "cls").mkdir(parents=True)
    (tmp_path / "root" / "cls" / "notes.txt").write_text("no images here")
    line = fails(["--root", str(tmp_path / "root"), "--out", str(tmp_path / "out")], capsys)
    assert "holds no images" in line


def test_too_few_images_for_warmup_and_one_batch(capsys, tmp_path, small_root) -> None:
    line = fails(["--root", str(small_root), "--batch-size", "8", "--warmup", "2", "--out", str(tmp_path)], capsys)
    assert "has 16 usable images" in line and "= 24" in line


def test_out_is_a_file(capsys, tmp_path, small_root) -> None:
    target = tmp_path / "taken"
    target.write_text("mine")
    line = fails(["--root", str(small_root), "--out", str(target)], capsys)
    assert "is a file" in line and target.read_text() == "mine"


def test_out_not_writable(capsys, tmp_path, small_root) -> None:
    (tmp_path / "file").write_text("")
    line = fails(["--root", str(small_root), "--out", str(tmp_path / "file" / "sub")], capsys)
    assert "not writable" in line


def test_gpu_config_without_cuda(capsys, tmp_path, small_root, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    line = fails(["--root", str(small_root), "--configs", "gpu", "--out", str(tmp_path)], capsys)
    assert "needs CUDA" in line
    assert not (tmp_path / "results.csv").exists() and not (tmp_path / "throughput.png").exists()


def test_failed_run_keeps_the_previous_log(capsys, tmp_path) -> None:
    (tmp_path / "bench.log").write_text("the previous run")
    fails(["--root", str(tmp_path / "missing"), "--out", str(tmp_path)], capsys)
    assert (tmp_path / "bench.log").read_text() == "the previous run"
    assert "is not a folder" in (tmp_path / "bench-failed.log").read_text()


def test_missing_torchvision_is_one_line(capsys, tmp_path, small_root, monkeypatch) -> None:
    def broken() -> None:
        raise ImportError("the bench needs torchvision (test)")

    monkeypatch.setattr(cli, "import_torchvision", broken)
    assert "needs torchvision" in fails(["--smoke", "--root", str(small_root), "--out", str(tmp_path)], capsys)


def test_main_module_returns_status(capsys, tmp_path) -> None:
    assert cli_main(["bench", "--root", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 1
    assert "is not a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli_main(["bench", "--max-batches", "-1"])
    assert exc.value.code == 2


# ----------------------------------------------------------------------------- bad files


def test_image_problem_finds_truncated_and_fake_files(tmp_path, small_root) -> None:
    good = next(small_root.rglob("*.JPEG"))
    assert data.image_problem(good) is None
    (tmp_path / "cut.jpg").write_bytes(good.read_bytes()[:-200])
    (tmp_path / "text.jpg").write_text("not an image")
    (tmp_path / "empty.png").write_bytes(b"")
    assert "truncated" in data.image_problem(tmp_path / "cut.jpg")
    assert "not an image" in data.image_problem(tmp_path / "text.jpg")
    assert "empty" in data.image_problem(tmp_path / "empty.png")


@pytest.fixture
def root_with_bad_files(tmp_path, small_root) -> Path:
    require_torchvision()
    root = copy_root(small_root, tmp_path / "root")
    first = next((root / "class_000").glob("*.JPEG"))
    (root / "class_000" / "zz_truncated.jpg").write_bytes(first.read_bytes()[:-300])
    (root / "class_001" / "zz_text.jpg").write_text("hello")
    return root


def test_bad_file_ends_the_run_naming_it(capsys, tmp_path, root_with_bad_files) -> None:
    argv = ["--smoke", "--root", str(root_with_bad_files), "--configs", "batch", "--workers", "1",
            "--out", str(tmp_path / "out"), "--no-progress"]
    line = fails(argv, capsys)
    assert "bad image file" in line and "zz_t" in line and "--skip-bad-files" in line


def test_bad_file_the_timed_cells_miss_still_ends_the_run_in_one_line(capsys, tmp_path, small_root) -> None:
    # The cells read the first batches only; the kernel bound and the Python
    # time read files past them, where this one lies.
    require_torchvision()
    root = copy_root(small_root, tmp_path / "root")
    (root / "class_001" / "zz_text.jpg").write_text("hello")
    argv = ["--smoke", "--root", str(root), "--configs", "batch", "--workers", "1", "--batch-size", "2",
            "--out", str(tmp_path / "out"), "--no-progress"]
    line = fails(argv, capsys)
    assert "bad image file" in line and "zz_text.jpg" in line


def test_skip_bad_files_keeps_the_run(capsys, tmp_path, root_with_bad_files) -> None:
    argv = ["--smoke", "--root", str(root_with_bad_files), "--configs", "batch", "--workers", "1",
            "--out", str(tmp_path / "out"), "--no-progress", "--skip-bad-files"]
    rows = bench.main(argv)
    err = capsys.readouterr().err
    assert "zz_truncated.jpg" in err and "zz_text.jpg" in err
    assert all(r["img/s"] for r in rows)


# ----------------------------------------------------------------------------- measuring


def test_count_images() -> None:
    assert bench.count_images((torch.zeros(5, 3, 2, 2), torch.zeros(5))) == 5
    assert bench.count_images({"image": torch.zeros(3, 3, 2, 2)}) == 3
    assert bench.count_images((torch.zeros(3, 2, 2), 1)) == 1


def test_measure_skips_warmup_and_stops() -> None:
    batches = [(torch.zeros(4, 3, 2, 2), torch.zeros(4))] * 10
    m = bench.measure(batches, max_items=6, warmup=2)
    assert m.images == 16 and m.timed_items == 4 and m.complete  # items 3..6 are timed
    assert m.first_batch_s >= 0 and m.seconds > 0 and m.img_per_s > 0


def test_a_run_shorter_than_one_batch_after_warmup_has_no_rate() -> None:
    batches = [(torch.zeros(4, 3, 2, 2), torch.zeros(4))] * 2
    m = bench.measure(batches, warmup=2)
    assert not m.complete and m.img_per_s != m.img_per_s  # NaN
    row = measure.make_row("c", 1, "ThreadDataLoader", m, baseline=100.0)
    assert row["img/s"] is None and row["ratio"] is None and "too short" in row["note"]
    samples = [1] * 5  # per-sample config: 3 samples timed, one batch is 4
    m = bench.measure(samples, warmup=2, min_timed=4)
    assert m.timed_items == 3 and not m.complete


def test_ctrl_c_keeps_the_rows_measured(tmp_path, small_root, monkeypatch, capsys) -> None:
    require_torchvision()
    calls = []

    def fake_measure(loader, **kwargs):
        calls.append(kwargs)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return measure.Measurement(8, 0.01, 0.001, 2, True)

    monkeypatch.setattr(measure, "measure", fake_measure)
    for stale in ("results.txt", "throughput.png"):  # a previous run's
        (tmp_path / stale).write_text("old")
    with pytest.raises(SystemExit) as exc:
        bench.main(["--smoke", "--root", str(small_root), "--configs", "batch", "--out", str(tmp_path), "--no-progress"])
    assert exc.value.code == 130
    assert not (tmp_path / "results.txt").exists() and not (tmp_path / "throughput.png").exists()
    with (tmp_path / "results.csv").open() as f:
        kept = list(csv.DictReader(f))
    assert [r["loader"] for r in kept] == ["DataLoader", "DataLoader + kernel"]
    assert "interrupted" in capsys.readouterr().err
    assert (tmp_path / "bench-failed.log").exists() and not (tmp_path / "bench.log").exists()


def test_cell_error_without_bad_files_is_marked_not_fatal(tmp_path, small_root, monkeypatch) -> None:
    require_torchvision()

    def flaky(loader, **kwargs):
        raise RuntimeError("worker exploded\nsecond line")

    monkeypatch.setattr(measure, "measure", flaky)
    monkeypatch.setattr(cli, "python_time_per_image", lambda *a, **k: None)
    rows = bench.main(["--smoke", "--root", str(small_root), "--configs", "batch", "--workers", "1",
                       "--out", str(tmp_path), "--no-progress"])
    measured = [r for r in rows if r["loader"] != pipelines.KERNEL_BOUND]
    assert measured and all(r["img/s"] is None and r["note"] == "failed: RuntimeError: worker exploded" for r in measured)


def test_worker_processes_above_a_rows_workers_is_said_in_one_line(tmp_path, small_root, monkeypatch, capsys) -> None:
    require_torchvision()
    if not pipelines.supports_worker_processes():
        pytest.skip("no worker_processes rows here")
    built = []
    real_build = pipelines.build_loader

    def spy(name, config, root, workers, worker_processes=None, **kwargs):
        if name == pipelines.THREADS_IN_PROCESSES:
            built.append((workers, pipelines.worker_processes_for(workers, worker_processes)))
        return real_build(name, config, root, workers=workers, worker_processes=worker_processes, **kwargs)

    monkeypatch.setattr(measure, "build_loader", spy)
    monkeypatch.setattr(measure, "measure", lambda loader, **kwargs: measure.Measurement(8, 0.01, 0.001, 2, True))
    monkeypatch.setattr(cli, "python_time_per_image", lambda *a, **k: None)
    monkeypatch.setattr(cli, "kernel_bound_rate", lambda files, size, processes, **kwargs: (10.0 * processes, 7))
    argv = ["--smoke", "--root", str(small_root), "--configs", "batch", "--workers", "1,2", "--out", str(tmp_path),
            "--no-progress"]
    rows = bench.main([*argv, "--worker-processes", "2"])
    err = capsys.readouterr().err
    assert err.count("note:") == 1 and "--worker-processes 2 is more than the workers of the rows at 1 workers" in err
    assert built == [(1, 1), (2, 2)]
    assert [r["note"] for r in rows if r["loader"] == pipelines.THREADS_IN_PROCESSES] == ["P=1", "P=2"]
    bench.main([*argv, "--worker-processes", "1"])
    assert "note:" not in capsys.readouterr().err


def test_worker_processes_rows_follow_the_signature(monkeypatch) -> None:
    import inspect

    from threadloader import ThreadDataLoader

    has = "worker_processes" in inspect.signature(ThreadDataLoader).parameters
    assert pipelines.supports_worker_processes() == has
    if not has:
        with pytest.raises(ValueError, match="worker_processes"):
            pipelines.build_loader(pipelines.THREADS_IN_PROCESSES, "batch", ".", workers=1)


def test_build_loader_rejects_unknown() -> None:
    with pytest.raises(ValueError):
        bench.build_loader("DataLoader", "nope", ".", workers=1)
    with pytest.raises(ValueError):
        bench.build_loader("Nope", "batch", ".", workers=1)


def test_python_time_per_image(small_root) -> None:
    require_torchvision()
    files = data.image_files(small_root)
    pt = python_time.python_time_per_image(small_root, files, size=32, batch_size=4, images=8, rounds=2)
    assert pt is not None and pt["images"] >= 8 and pt["data_images"] == 8
    for prefix in ("", "data_"):
        assert pt[prefix + "path_us"] > 0 and pt[prefix + "native_us"] > 0
        assert pt[prefix + "python_us"] == pytest.approx(pt[prefix + "path_us"] - pt[prefix + "native_us"])
    assert pt["data_native_spread_us"] >= 0
    text = report.format_python_time(pt)
    assert "us of its native calls" in text and "on this run's JPEGs (8)" in text
    # No JPEG in the data: the small-image figure alone.
    only_small = python_time.python_time_per_image(small_root, [], size=32, batch_size=4, images=8, rounds=1)
    assert only_small is not None and "data_python_us" not in only_small
    assert "this run's JPEGs" not in report.format_python_time(only_small)
    assert report.format_python_time(None) == "Python time per image: not measured"


def test_python_time_within_the_noise_is_not_printed_as_a_figure() -> None:
    pt = {"path_us": 90.0, "native_us": 95.0, "python_us": -5.0, "images": 256.0,
          "data_path_us": 3000.0, "data_native_us": 3010.0, "data_python_us": -10.0, "data_images": 64.0,
          "data_native_spread_us": 40.0}
    text = report.format_python_time(pt)
    assert "-5.0 us" not in text and "-10.0 us" not in text and text.count("not resolved") == 2
    pt.update(python_us=20.0, data_path_us=3100.0, data_python_us=90.0)
    text = report.format_python_time(pt)
    assert "= 20.0 us" in text and "= 90.0 us" in text and "not resolved" not in text


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="usage is read from Linux /proc")
def test_usage_counts_this_process_and_its_workers() -> None:
    import numpy as np

    from threadloader.bench.usage import usage

    least = (64 << 20) >> 21  # 64 MiB in faults of 2 MiB (huge) pages, at the fewest
    before = usage()
    block = np.ones(64 << 20, dtype=np.uint8)  # fresh memory, touched
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # CPU time
        pass
    mine = usage() - before
    assert mine.faults >= least and mine.cpu_s >= 0.2
    del block
    code = ("import sys, time; b = bytearray(b'1' * (64 << 20)); t = time.process_time() + 0.3\n"
            "while time.process_time() < t: pass\nprint('ok', flush=True); sys.stdin.read()")
    start = usage()
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ok"  # the child has touched its memory and used its CPU
        theirs = usage() - start
        assert theirs.faults >= least and theirs.cpu_s >= 0.2
    finally:
        child.kill()
        child.wait()


def test_rows_report_cores_and_page_faults_per_timed_image(monkeypatch) -> None:
    from threadloader.bench.usage import Usage

    clock = iter([0.0, 0.5, 10.0, 11.0])  # start, first item, end of warm-up, end
    counts = iter([Usage(5.0, 1000), Usage(8.0, 1600)])
    monkeypatch.setattr(measure, "usage", lambda: next(counts))
    monkeypatch.setattr(measure.time, "perf_counter", lambda: next(clock))
    batches = [torch.zeros(4, 3, 2, 2) for _ in range(4)]
    m = measure.measure(batches, warmup=1)
    assert m.images == 12 and m.page_faults == 600 and m.cpu_s == 3.0 and m.cores == pytest.approx(3.0)
    row = measure.make_row("c", 1, "x", m)
    assert row["faults/img"] == 50.0 and row["cores"] == 3.0
    monkeypatch.undo()
    monkeypatch.setattr(measure, "usage", lambda: None)  # not Linux
    row = measure.make_row("c", 1, "x", measure.measure(batches, warmup=1))
    assert row["faults/img"] is None and row["cores"] is None


def test_native_frame_calls_do_the_python_paths_work(small_root, monkeypatch) -> None:
    """The Python path's native loop decodes every file at decode_image's scale and resizes it (not a no-op)."""
    from threadloader.images import decode
    from threadloader.io import decode_image

    files = [str(f) for f in data.image_files(small_root) if f.suffix.lower() in (".jpg", ".jpeg")][:3]
    seen = []
    real = torch.from_numpy

    def spy(arr):
        seen.append(arr.shape[2:])  # (1, C, H, W): the decoded image handed to the resize
        return real(arr)

    monkeypatch.setattr(decode, "_native_load", None)
    assert python_time.native_calls_label().startswith("file read, simplejpeg decode")
    expected = [decode_image(f, size=(32, 32))._state[0].shape[:2] for f in files]
    monkeypatch.setattr(torch, "from_numpy", spy)
    assert python_time._native_frame_calls(files, (32, 32), 2) > 0
    monkeypatch.undo()
    assert seen == expected


@pytest.mark.parametrize("few_cores", [True, False])
def test_native_frame_calls_do_the_c_parts_work(small_root, monkeypatch, few_cores) -> None:
    """With the C part: each file read and decoded by it, each batch resized as frame_collate would."""
    from threadloader.images import decode, frames
    from threadloader.io import decode_image

    if decode._native_load is None:
        pytest.skip("threadloader.images._native not built or turned off")
    files = [str(f) for f in data.image_files(small_root) if f.suffix.lower() in (".jpg", ".jpeg")][:3]
    expected = [decode_image(f, size=(32, 32))._state[0].shape[:2] for f in files]
    loads, resized = [], []
    real_load, real_resize = decode._native_load, frames._native_resize
    monkeypatch.setattr(decode, "_native_load", lambda *a: loads.append(a[0]) or real_load(*a))
    monkeypatch.setattr(frames, "_native_resize", lambda s, *a: resized.extend(x.shape[:2] for x in s) or
                        real_resize(s, *a))
    monkeypatch.setattr(frames, "_few_cores", few_cores)
    monkeypatch.setattr(frames, "_LARGE_SOURCE_PIXELS", 0)  # every source is large
    assert python_time.native_calls_label().startswith("threadloader's C part")
    assert python_time._native_frame_calls(files, (32, 32), 2) > 0
    assert loads == files
    assert resized == ([] if few_cores else expected)


def test_kernel_bound_rows_are_measured_per_process_count() -> None:
    rates = {1: (100.0, 50), 2: (180.0, 90)}
    rows = kernel_bound.kernel_bound_rows(["batch", "normalize"], [1, 2, 4], rates, cores=2,
                                     baselines={(bench.CONFIGS["batch"], 2): 50.0})
    assert [(r["config"], r["workers"]) for r in rows] == [
        (bench.CONFIGS[c], w) for c in ("batch", "normalize") for w in (1, 2, 4)]
    assert [r["img/s"] for r in rows] == [100.0, 180.0, 180.0] * 2  # k = min(workers, cores), reused
    assert [r["images"] for r in rows] == [50, 90, 90] * 2
    assert all(r["loader"] == pipelines.KERNEL_BOUND for r in rows)
    assert rows[0]["note"] == "measured: 1 independent process, 1 thread each, kernel alone"
    assert rows[2]["note"] == "measured: 2 independent processes, 1 thread each, kernel alone"
    assert not any("estimate" in r["note"] for r in rows)
    assert rows[1]["ratio"] == 3.6 and rows[0]["ratio"] is None
    failed = kernel_bound.kernel_bound_rows(["batch"], [1, 4], {1: (100.0, 50)}, cores=2, errors={2: "it broke"})
    assert failed[0]["img/s"] == 100.0
    assert failed[1]["img/s"] is None and failed[1]["note"] == "failed: it broke"


def test_the_bench_measures_each_process_count_once(monkeypatch, capsys) -> None:
    calls = []

    def fake(files, size, processes, **kwargs):
        calls.append(processes)
        if processes == 4:
            raise bench.BenchError("kernel bound (4 processes): process 3 failed: OSError: boom")
        return 10.0 * processes, 7

    monkeypatch.setattr(cli, "kernel_bound_rate", fake)
    s = {"mode": "smoke", "size": 16, "workers": [1, 2, 3, 4, 8]}
    rates, errors = cli._kernel_bounds([Path("x.jpg")], s, cores=4, bad=cli._BadFiles([]))  # no bad image
    assert calls == [1, 2, 3, 4]  # 8 workers share the measurement of 4 (the cores)
    assert rates == {1: (10.0, 7), 2: (20.0, 7), 3: (30.0, 7)} and "OSError: boom" in errors[4]
    assert "warning: kernel bound (4 processes)" in capsys.readouterr().err


def _children_but_resource_tracker() -> set[int]:
    import psutil

    # spawn's resource tracker is started once per parent and lives as long as it: not ours to join.
    pids = set()
    for c in psutil.Process().children(recursive=True):
        try:
            if c.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(c.cmdline()):
                pids.add(c.pid)
        except psutil.NoSuchProcess:  # ended while listed
            pass
    return pids


def test_kernel_bound_rate_runs_processes_and_joins_them(small_root) -> None:
    import multiprocessing

    files = data.image_files(small_root)
    before = _children_but_resource_tracker()
    rate, images = kernel_bound.kernel_bound_rate(files, 16, 2, seconds=0.1, rounds=2, max_images=4, start_timeout=60)
    assert rate > 0 and 2 <= images <= 2 * 4  # each process did at least one image, at most the cap
    assert not multiprocessing.active_children()
    assert _children_but_resource_tracker() <= before
    with pytest.raises(ValueError):
        kernel_bound.kernel_bound_rate(files, 16, 0)
    with pytest.raises(ValueError):
        kernel_bound.kernel_bound_rate(files, 16, 1, rounds=0)
    with pytest.raises(ValueError):
        kernel_bound.kernel_bound_rate([], 16, 1)


def test_kernel_bound_rate_failure_is_one_line_not_a_hang(tmp_path) -> None:
    import multiprocessing

    for name in ("a.jpg", "b.jpg"):
        (tmp_path / name).write_text("not an image")
    before = _children_but_resource_tracker()
    with pytest.raises(bench.BenchError) as exc:
        # A hang at the start barrier would end after start_timeout with another message.
        kernel_bound.kernel_bound_rate(sorted(tmp_path.iterdir()), 16, 2, seconds=0.2, start_timeout=60)
    message = str(exc.value)
    assert "\n" not in message and message.startswith("kernel bound (2 processes): process ")
    assert "failed: ImageDecodeError" in message and ".jpg" in message
    assert not multiprocessing.active_children()
    assert _children_but_resource_tracker() <= before


# ----------------------------------------------------------------------------- report


ROWS = [
    {"config": "2 +batching", "workers": 1, "loader": "DataLoader", "img/s": 100.0, "first_batch_s": 0.5,
     "images": 64, "ratio": None, "note": ""},
    {"config": "2 +batching", "workers": 1, "loader": "ThreadDataLoader", "img/s": 250.0, "first_batch_s": 0.01,
     "images": 64, "ratio": 2.5, "note": ""},
    {"config": "2 +batching", "workers": 2, "loader": "DataLoader", "img/s": 180.0, "first_batch_s": 0.6,
     "images": 64, "ratio": None, "note": ""},
    {"config": "2 +batching", "workers": 2, "loader": "ThreadDataLoader", "img/s": 450.0, "first_batch_s": 0.02,
     "images": 64, "cores": 1.9, "faults/img": 3.2, "ratio": 2.5, "note": ""},
    {"config": "2 +batching", "workers": 2, "loader": "kernel bound", "img/s": 500.0, "first_batch_s": None,
     "images": 64, "ratio": 2.78, "note": "measured: 2 independent processes, 1 thread each, kernel alone"},
]


def test_table_numbers_fixed_precision_and_aligned() -> None:
    text = bench.format_table(ROWS, bench.COLUMNS)
    lines = text.splitlines()
    assert lines[0].split() == list(bench.COLUMNS)
    assert " 100.0 " in lines[2] and " 2.50" in lines[3] and "0.500" in lines[2]
    ends = {line.index("img/s") + len("img/s") if i == 0 else None for i, line in enumerate(lines[:1])}
    col_end = ends.pop()
    assert all(line[col_end - 1] == "0" for line in lines[2:])  # right-aligned under the header
    summary = bench.summarize(ROWS)
    threads = next(s for s in summary if s["loader"] == "ThreadDataLoader")
    assert threads["peak img/s"] == 450.0 and threads["at workers"] == 2
    assert threads["vs DataLoader"] == 2.5 and threads["of kernel bound"] == 0.9
    assert threads["cores"] == 1.9 and threads["faults/img"] == 3.2  # at the peak
    assert next(s for s in summary if s["loader"] == "DataLoader")["cores"] is None  # not measured


def test_plot_tells_the_story() -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    meta = {"batch_size": 32, "size": 224, "cores": 2, "device": "no GPU", "python": "3.11.7",
            "torch": "2.14.1", "date": "2026-11-22"}
    fig = bench.build_figure(ROWS, meta)
    (ax,) = fig.axes
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= 500
    notes = [t.get_text() for t in ax.texts]
    assert notes == ["x2.50"]  # ThreadDataLoader's peak (450) over DataLoader's peak (180)
    title = fig._suptitle.get_text()
    for fact in ("batch 32", "224x224", "2 cores", "no GPU", "Python 3.11.7", "torch 2.14.1", "2026-11-22"):
        assert fact in title, fact
    assert ax.get_legend() is None and len(fig.legends) == 1
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["DataLoader", "ThreadDataLoader", "kernel bound"]
    FigureCanvasAgg(fig).draw()
    legend_box = fig.legends[0].get_window_extent()
    assert not legend_box.overlaps(ax.get_window_extent())  # outside the data


def test_plot_labels_of_close_peaks_do_not_overlap() -> None:
    """Three loaders peaking at the same worker count within a few percent: three readable labels."""
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    config = bench.CONFIGS["batch"]
    rows = [dict(config=config, workers=w, loader=name, **{"img/s": rate})
            for name, rates in [("DataLoader", (300, 600)), ("DataLoader + kernel", (560, 1162)),
                                ("ThreadDataLoader", (600, 1194)), ("ThreadDataLoader, processes", (570, 1120)),
                                ("kernel bound", (620, 1231))]
            for w, rate in zip((1, 4), rates)]
    meta = {"batch_size": 32, "size": 224, "cores": 2, "device": "no GPU", "python": "3.11",
            "torch": "2.14", "date": "2026-11-23"}
    fig = bench.build_figure(rows, meta)
    (ax,) = fig.axes
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    assert sorted(t.get_text() for t in ax.texts) == ["x1.87", "x1.94", "x1.99"]
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    top = ax.get_window_extent(renderer).y1
    assert all(b.y1 <= top for b in boxes)  # inside the panel


def test_run_metadata_is_today() -> None:
    meta = report.run_metadata(batch_size=4, size=64)
    assert meta["date"] == datetime.date.today().isoformat() and meta["torch"] == torch.__version__


# ----------------------------------------------------------------------------- end to end


def test_bench_smoke_writes_outputs(tmp_path: Path, cache_dir: Path, capsys) -> None:
    require_torchvision()
    out = tmp_path / "out"
    rows = bench.main(["--smoke", "--out", str(out), "--cache-dir", str(cache_dir), "--no-progress",
                       "--configs", "resize,batch"])
    loaders = [n for n in bench.ALL_LOADERS if n != pipelines.THREADS_IN_PROCESSES or pipelines.supports_worker_processes()]
    measured = [r for r in rows if r["loader"] != pipelines.KERNEL_BOUND]
    assert len(measured) == 2 * 2 * len(loaders)  # configs x workers 1,2 x loaders
    assert len(rows) - len(measured) == 2 * 2  # the kernel bound per config and workers
    assert all(r["img/s"] > 0 for r in rows), rows
    assert all(r["ratio"] > 0 for r in rows if r["loader"] != "DataLoader")
    with (out / "results.csv").open() as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == bench.COLUMNS
        assert len(list(reader)) == len(rows)
    assert (out / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "measured" in (out / "bench.log").read_text()
    printed = capsys.readouterr().out
    assert "Python time per image" in printed and "Python time per image" in (out / "results.txt").read_text()
    for name in ("results.txt", "results.csv", "throughput.png", "bench.log"):
        assert str(out / name) in printed


def test_cli_help_and_version() -> None:
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "threadloader", *args], capture_output=True, text=True, cwd=ROOT, timeout=120
        )

    helped = cli("bench", "--help")
    assert helped.returncode == 0 and "--skip-bad-files" in helped.stdout and "--root" in helped.stdout
    version = cli("--version")
    assert version.returncode == 0 and "threadloader" in version.stdout


def test_frame_rows_resize_in_the_worker_and_normalize_in_collate(small_root) -> None:
    # Unbatched frames must be resized by the loader (not left pending for the
    # consumer), and the normalize config's batches come normalized from the
    # workers, equal to the uint8 batch converted afterwards.
    require_torchvision()
    from threadloader.images.frames import Frame

    sample = next(iter(pipelines.build_loader(pipelines.THREADS, "resize", small_root, workers=1, size=16)))
    frame = sample[0]
    assert isinstance(frame, Frame) and frame._state[1] is None, "resize left pending for the consumer"
    plain = next(iter(pipelines.build_loader(pipelines.THREADS, "batch", small_root, workers=1, batch_size=4, size=16)))
    norm = next(iter(pipelines.build_loader(pipelines.THREADS, "normalize", small_root, workers=1, batch_size=4, size=16)))
    assert norm[0].dtype == torch.float32 and norm[0].shape == plain[0].shape
    mean = torch.tensor(pipelines.IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(pipelines.IMAGENET_STD).view(1, 3, 1, 1)
    assert torch.allclose(norm[0], (plain[0].float() / 255 - mean) / std, atol=1e-5)


def test_runs_skip_the_in_flight_depth_and_cycle_small_folders(small_root) -> None:
    # 16 images, 2 workers: 4 batches are produced ahead (prefetch 2 x 2), so
    # they are never timed, and the timed run cycles over the folder.
    require_torchvision()
    bench_measure = importlib.import_module("threadloader.bench.measure")

    assert bench_measure.in_flight_depth(2) == 4
    rows = bench_measure.run_comparison(
        small_root, configs=["batch"], workers=[2], batch_size=4, max_batches=6, warmup_batches=1,
        size=16, loaders=[pipelines.THREADS], progress=False,
    )
    assert rows[0]["img/s"] and rows[0]["images"] == 6 * 4
    assert list(pipelines.Cycle(3, 7)) == [0, 1, 2, 0, 1, 2, 0] and len(pipelines.Cycle(3, 7)) == 7
    with pytest.raises(ValueError):
        pipelines.Cycle(0, 1)


def test_the_clock_starts_before_usage_is_read(monkeypatch) -> None:
    # Reading /proc takes time (30 ms with a thousand processes); the workers
    # keep producing meanwhile, so that time is the timed part's, or what they
    # made in it is consumed for free and the rate is inflated.
    from threadloader.bench.usage import Usage

    now = [0.0]

    def slow_usage():
        now[0] += 10.0
        return Usage(0.0, 0)

    monkeypatch.setattr(measure.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(measure, "usage", slow_usage)
    m = measure.measure([torch.zeros(4, 3, 2, 2) for _ in range(3)], warmup=1)
    assert m.seconds >= 10.0 and m.img_per_s <= 8 / 10.0


def test_cores_need_a_window_the_cpu_time_resolves() -> None:
    import dataclasses

    # Read in 10 ms clock ticks, a 0.1 s window cannot tell 0.9 cores from 1.1.
    coarse = measure.Measurement(10, 0.1, 0.0, 3, True, cpu_s=0.09, page_faults=0, cpu_resolution_s=0.01)
    assert coarse.cores is None and measure.make_row("c", 1, "x", coarse)["cores"] is None
    assert dataclasses.replace(coarse, seconds=1.0).cores == pytest.approx(0.09)
    assert dataclasses.replace(coarse, cpu_resolution_s=0.0).cores == pytest.approx(0.9)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process CPU clocks are Linux's")
def test_usage_reads_each_process_cpu_clock() -> None:
    from threadloader.bench.usage import usage

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert usage().resolution_s == 0.0  # no clock-tick rounding, for this process or its child
    finally:
        child.kill()
        child.wait()


def test_kernel_bound_counts_the_span_not_each_processs_own_rate() -> None:
    from threadloader.bench import kernel_bound

    # Two processes that could not run at once (one usable core): 8 images each, one after the other.
    assert kernel_bound._round_rate([(8, 0.0, 1.0), (8, 1.0, 2.0)]) == (pytest.approx(8.0), 16)
    assert kernel_bound._round_rate([(8, 0.0, 1.0), (8, 0.0, 1.0)]) == (pytest.approx(16.0), 16)


def test_bench_cores_are_the_usable_ones(monkeypatch) -> None:
    from threadloader.bench import usage as bench_usage
    from threadloader.stats import cpu

    monkeypatch.setattr(cpu, "usable_cpus", lambda: [0])
    assert bench_usage.usable_cores() == 1
    monkeypatch.setattr(cli, "usable_cores", lambda: 1)
    assert cli.bench_workers() == [1, 2]
    with pytest.raises(argparse.ArgumentTypeError, match="at most 16"):
        cli.parse_workers("17")


def test_a_class_folder_without_usable_images_is_one_line(capsys, tmp_path, small_root) -> None:
    root = copy_root(small_root, tmp_path / "root")
    (root / "zz_empty").mkdir()
    (root / "zz_empty" / "README").write_text("no images here")
    line = fails(["--smoke", "--root", str(root), "--out", str(tmp_path / "out")], capsys)
    assert "class folder 'zz_empty' holds no usable image" in line


def test_rows_of_threads_in_processes_name_the_processes_that_ran(small_root) -> None:
    require_torchvision()
    if not pipelines.supports_worker_processes():
        pytest.skip("no worker_processes")
    rows = measure.run_comparison(
        small_root, configs=["batch"], workers=[1], batch_size=4, max_batches=1, warmup_batches=0,
        size=16, loaders=[pipelines.THREADS_IN_PROCESSES], progress=False, worker_processes=8,
    )
    assert rows[0]["note"] == "P=1"  # asked for 8; one worker runs in one process


def test_proxy_gil_counts_read_perf_script_lines() -> None:
    """Drops in the window; a take counts as blocking once, however often it waits."""
    from threadloader.bench.proxy import _count_events

    script = """
  10  1.0: tlgil:drop:
  10  2.0: tlgil:take:
  10  2.1: tlgil:wait:
  10  2.2: tlgil:wait:
  11  2.3: tlgil:drop:
  11  2.4: tlgil:take:
  11  2.5: tlgil:drop:
  12  2.6: tlgil:wait:
  10  9.0: tlgil:drop:
"""
    # Before the window (1.0) and after it (9.0) nothing counts; thread 10's take waits twice but
    # blocks once; 11's take does not wait; 12's wait has no take seen: not counted.
    assert _count_events(script, 1.5, 3.0) == (2, 1)


def test_proxy_runs_both_frame_paths_and_restores_the_choice(monkeypatch, tmp_path, capsys) -> None:
    from threadloader.bench import proxy
    from threadloader.images import decode as image

    seen, seen_batches = [], []

    def fake_rate(name, root, w, batch_size, batches):
        seen.append((os.environ.get("THREADLOADER_NATIVE"), image._native_load is not None, name, w))
        seen_batches.append((name, batches))
        return 100.0

    monkeypatch.setattr(proxy, "_rate", fake_rate)
    monkeypatch.setattr(proxy, "kernel_bound_rate", lambda *a, **k: (200.0, 10))
    monkeypatch.setattr(proxy, "gil_probes", lambda: "test")
    monkeypatch.setattr(proxy, "prepare_dataset", lambda **k: tmp_path)
    monkeypatch.setattr(proxy, "image_files", lambda root: ["x.jpg"])
    monkeypatch.delenv("THREADLOADER_NATIVE", raising=False)
    before = image._native_load
    args = cli.build_parser().parse_args(["--proxy", "--workers", "2", "--no-progress"])
    status, rows = cli.run_cli(args)
    assert status == 0 and [r["threads/bound"] for r in rows] == [0.5] * len(rows)
    runs = len(rows) * 2  # threads and DataLoader + kernel per path and worker count
    assert len(seen) == runs * proxy._ROUNDS and {b for *_, b in seen_batches} == {proxy._BATCHES}
    paths = [r["path"] for r in rows]
    assert paths == (["python", "native"] if before is not None else ["python"])
    assert ("0", False, proxy.THREADS, 2) in seen
    if before is not None:
        assert ("1", True, proxy.THREADS, 2) in seen
    assert "THREADLOADER_NATIVE" not in os.environ and (image._native_load is None) == (before is None)
    assert "not counted: test" in capsys.readouterr().out


# ----------------------------------------------------------------------------- the workload zoo


def test_zoo_runs_end_to_end_and_reports_every_cell(tmp_path, cache_dir) -> None:
    require_torchvision()
    from threadloader.bench import zoo, zoo_data

    out = tmp_path / "out"
    rows = bench.main(["--zoo", "--smoke", "--workers", "1,2", "--out", str(out), "--cache-dir", str(cache_dir),
                       "--no-progress"])
    names = {w.name for w in zoo_data.WORKLOADS}
    assert {(r["workload"], r["workers"], r["loader"]) for r in rows} == {
        (n, w, loader) for n in names for w in (1, 2) for loader in zoo.LOADERS}
    for r in rows:
        assert r["note"] == "" and r["rate"] > 0, r
        assert r["ratio"] is not None, r
        assert (r["moved"] is None) == (r["loader"] != zoo.DEFAULT) and r["rounds"] == 1, r
    assert all(r["ratio"] == 1.0 for r in rows if r["loader"] == zoo.BASELINE)
    # One worker per process, as DataLoader splits the work.
    assert {(r["workers"], r["processes"]) for r in rows if r["loader"] == zoo.PROCESSES} == {(1, 1), (2, 2)}
    text = (out / "zoo.txt").read_text()
    assert "per torch call" in text and "DataLoader on every cell" in text
    assert "default moved into processes in: " in text
    for n in names:
        assert n in text
    with open(out / "zoo.csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    assert (out / "zoo.png").read_bytes()[:4] == b"\x89PNG"


def test_zoo_ratio_is_the_median_of_each_rounds_ratio(monkeypatch) -> None:
    """A round's ratio takes DataLoader's rate of that round: a slow round slows both sides of it."""
    from threadloader.bench import zoo, zoo_data

    rates = {zoo.BASELINE: [10.0, 20.0, 10.0], zoo.DEFAULT: [10.0, 18.0, 9.0]}
    calls: dict[str, int] = {}

    def fake_cell(name, *args):
        k = calls[name] = calls.get(name, -1) + 1
        return zoo.Timed(rates.get(name, [5.0] * 3)[k], name == zoo.DEFAULT)

    monkeypatch.setattr(zoo, "time_cell", fake_cell)
    monkeypatch.setattr(zoo, "build_workload", lambda *a: (None, None))
    rows = zoo.measure_zoo(zoo_data.WORKLOADS[:1], [2], zoo_data.SCALES["smoke"], rounds=3, cache_dir=None,
                           processes=None, progress=False)
    row = {r.loader: r for r in rows}[zoo.DEFAULT]
    # The ratio of the medians would be 10 / 10.
    assert row.rate == 10.0 and row.ratio == pytest.approx(0.9) and row.moved == 3
    assert (row.low, row.high) == (pytest.approx(0.9), pytest.approx(1.0))
    assert {r.loader: r.ratio for r in rows}[zoo.THREADS] == pytest.approx(0.5)


def test_zoo_table_says_where_the_default_moved(monkeypatch) -> None:
    """Rounds in which the default moved into processes, and into the consumer's thread, are counted and said."""
    from threadloader.bench import zoo, zoo_data

    def fake_cell(name, *args):
        return zoo.Timed(10.0, False, None, name == zoo.DEFAULT)

    monkeypatch.setattr(zoo, "time_cell", fake_cell)
    monkeypatch.setattr(zoo, "build_workload", lambda *a: (None, None))
    rows = zoo.measure_zoo(zoo_data.WORKLOADS[:1], [2], zoo_data.SCALES["smoke"], rounds=2, cache_dir=None,
                           processes=None, progress=False)
    row = {r.loader: r for r in rows}[zoo.DEFAULT]
    assert (row.moved, row.inlined) == (0, 2)
    name = zoo_data.WORKLOADS[0].name
    assert (f"default moved into processes in: no cell; into the consumer's thread in: {name} w=2 (2/2); "
            "elsewhere it stayed on threads") in zoo.format_zoo_table(rows)


def test_zoo_loaders_read_the_same_batches_as_dataloader(cache_dir) -> None:
    """Every loader of a zoo cell yields DataLoader's batches for the same seed: the zoo compares like with like."""
    require_torchvision()
    from threadloader.bench import zoo, zoo_data

    scale = zoo_data.SCALES["smoke"]
    for w in zoo_data.WORKLOADS:
        dataset, collate = zoo_data.build_workload(w, scale, cache_dir)
        per_item = w.batch_size or 1
        got = {}
        for name in zoo.LOADERS:
            torch.manual_seed(0)
            loader = zoo._loader(name, dataset, collate, w.batch_size, 2, 2 * per_item, processes=2)
            got[name] = list(loader)
        for name in zoo.LOADERS[1:]:
            assert len(got[name]) == len(got[zoo.BASELINE]) == 2
            for a, b in zip(got[name], got[zoo.BASELINE]):
                torch.testing.assert_close(a, b, msg=f"{w.name} {name}")


def test_zoo_workloads_flag_selects_and_refuses_unknown_names(tmp_path, cache_dir, capsys) -> None:
    require_torchvision()
    rows = bench.main(["--zoo", "--smoke", "--workers", "1", "--zoo-workloads", "trivial,npy", "--out", str(tmp_path),
                       "--cache-dir", str(cache_dir), "--no-progress"])
    assert {r["workload"] for r in rows} == {"trivial", "npy"}
    with pytest.raises(SystemExit):
        bench.main(["--zoo", "--zoo-workloads", "nope"])
    assert "unknown workload(s) nope" in capsys.readouterr().err


@given(st.integers(min_value=1, max_value=9), st.integers(min_value=0, max_value=50))
def test_zoo_order_balances_positions_and_neighbours(n, start) -> None:
    from collections import Counter

    from threadloader.bench.zoo import balanced_order

    items = [f"l{i}" for i in range(n)]
    period = n if n % 2 == 0 else 2 * n
    orders = [balanced_order(items, k) for k in range(start, start + period)]
    assert all(sorted(o) == sorted(items) for o in orders)
    positions = Counter((i, name) for o in orders for i, name in enumerate(o))
    assert set(positions.values()) == {period // n}
    if n > 1:
        pairs = Counter((a, b) for o in orders for a, b in zip(o, o[1:]))
        assert len(pairs) == n * (n - 1) and len(set(pairs.values())) == 1


def test_zoo_targets_name_the_worst_cell() -> None:
    from threadloader.bench import zoo

    rows = [zoo.ZooRow("a", 2, zoo.DEFAULT, 10.0, 0.97, None),
            zoo.ZooRow("b", 2, zoo.DEFAULT, 5.0, 0.5, None, low=0.4, high=0.96),
            zoo.ZooRow("a", 2, zoo.PROCESSES, 10.0, 1.2, 2), zoo.ZooRow("b", 4, zoo.PROCESSES, None, None, 2, "failed")]
    lines = zoo.target_lines(rows)
    assert lines[0].startswith("default >= 0.95x") and "NOT met on 1 of 2" in lines[0] and "0.50x: b at 2" in lines[0]
    assert lines[0].endswith("rounds' ratios of the cells missed: b w=2 0.40-0.96")
    assert "NOT met on 1 of 2" in lines[1] and "failed: b at 4" in lines[1] and "missed" not in lines[1]
    assert "met (worst 0.97x" in zoo.target_lines(rows[:1])[0]
    assert "failed" in zoo.format_zoo_table([zoo.ZooRow("a", 2, zoo.BASELINE, 3.0, 1.0, None),
                                             *[zoo.ZooRow("a", 2, n, None, None, None, "failed: x") for n in zoo.LOADERS[1:]]])


def test_zoo_names_the_cells_where_a_loader_faults_more_pages_than_dataloader(monkeypatch) -> None:
    """Page faults per sample: the median of the rounds, and a note naming the cells above DataLoader's."""
    from threadloader.bench import zoo, zoo_data

    faults = {zoo.BASELINE: [2.0, 3.0, 4.0], zoo.THREADS: [400.0, 300.0, 500.0], zoo.PROCESSES: [5.0, 6.0, 7.0]}
    calls: dict[str, int] = {}

    def fake_cell(name, *args):
        k = calls[name] = calls.get(name, -1) + 1
        return zoo.Timed(10.0, False, faults[name][k] if name in faults else None)

    monkeypatch.setattr(zoo, "time_cell", fake_cell)
    monkeypatch.setattr(zoo, "build_workload", lambda *a: (None, None))
    rows = zoo.measure_zoo(zoo_data.WORKLOADS[:1], [2], zoo_data.SCALES["smoke"], rounds=3, cache_dir=None,
                           processes=None, progress=False)
    by_loader = {r.loader: r.faults for r in rows}
    assert by_loader == {zoo.BASELINE: 3.0, zoo.DEFAULT: None, zoo.THREADS: 400.0, zoo.PROCESSES: 6.0}
    name = zoo_data.WORKLOADS[0].name
    assert zoo.format_zoo_table(rows).splitlines()[-1] == (
        f"page faults per sample (median): {name} w=2 threads 400 (DataLoader 3)")
    calm = [r._replace(faults=3.0 if r.faults is not None else None) for r in rows]
    assert zoo.format_zoo_table(calm).splitlines()[-1] == (
        "page faults per sample (median): no loader above twice DataLoader's and 16 more")
    assert "page faults" not in zoo.format_zoo_table([r._replace(faults=None) for r in rows])


def test_torch_call_cost_times_the_routing(monkeypatch) -> None:
    from threadloader.bench import torch_call
    from threadloader.worker import rng as _rng

    cost = torch_call.torch_call_cost(calls=200, rounds=1)
    assert cost.plain_ns > 0 and cost.worker_ns > 0 and cost.bare_mode_ns > 0
    assert cost.rand_plain_ns > 0 and cost.rand_worker_ns > 0
    assert "ns added by a worker thread" in cost.line() and "per random op (torch.rand(8))" in cost.line()
    routed = []
    original = _rng._with_generator

    def spy(generator, args, kwargs):
        kwargs = original(generator, args, kwargs)
        routed.append((generator, kwargs.get("generator")))
        return kwargs

    monkeypatch.setattr(_rng, "_with_generator", spy)
    torch_call.torch_call_cost(calls=10, rounds=2)
    # Only the worker side's torch.rand calls are routed (x.add never is), each
    # to the worker's own generator: worker 0 of base seed 0, seeded 0.
    assert len(routed) == 20
    assert all(given is passed and given is not torch.default_generator and given.initial_seed() == 0
               for given, passed in routed)
