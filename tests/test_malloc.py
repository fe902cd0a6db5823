"""glibc's malloc thresholds: worker threads that allocate big buffers do not fault fresh pages on each sample."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from threadloader._platform import malloc

glibc_only = pytest.mark.skipif(not malloc.is_glibc(), reason="glibc's malloc thresholds")

#: Two worker threads convolving per sample, as the zoo's torch-heavy workload
#: does; prints the page faults per sample of the timed part.
CONVOLVING_THREADS = textwrap.dedent(
    """
    import resource
    import torch
    import torch.nn.functional as F
    from torch.utils.data import Dataset
    from threadloader import ThreadDataLoader

    class Convolved(Dataset):
        def __init__(self):
            self.x = torch.randn(1, 3, 96, 96, generator=torch.Generator().manual_seed(0))
            self.w = torch.randn(16, 3, 5, 5, generator=torch.Generator().manual_seed(1))

        def __len__(self):
            return 240

        def __getitem__(self, i):
            y = F.conv2d(self.x, self.w, padding=2)
            return F.conv2d(y, self.w.new_ones(16, 16, 3, 3), padding=1).sum().item()

    it = iter(ThreadDataLoader(Convolved(), batch_size=8, num_workers=2, worker_processes=0))
    for _ in range(4):
        next(it)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    items = sum(len(b) for b in it)
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / items)
    """
)


def faults_per_sample() -> float:
    """Page faults per sample of two convolving worker threads in a fresh interpreter, glibc's defaults."""
    fixed = {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"}  # these pin the thresholds
    env = {k: v for k, v in os.environ.items() if k not in fixed}
    out = subprocess.run([sys.executable, "-c", CONVOLVING_THREADS], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return float(out.stdout.strip().splitlines()[-1])


@glibc_only
def test_convolving_worker_threads_reuse_their_pages():
    # Without the thresholds raised, the second thread's arena gives its
    # buffers back and faults them in again: hundreds of faults per sample.
    assert faults_per_sample() < 16


@glibc_only
def test_settle_runs_once_per_process_and_a_thread_pool_does_it():
    code = textwrap.dedent(
        """
        from threadloader import ThreadDataLoader
        from threadloader._platform import malloc
        list(ThreadDataLoader(range(4), num_workers=2, worker_processes=0))
        print(malloc.settle())
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr[-2000:]
    code = "from threadloader._platform import malloc; print(malloc.settle(), malloc.settle())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True False", out.stderr[-2000:]


def test_settle_does_nothing_off_glibc(monkeypatch):
    def no_libc(*args, **kwargs):
        raise AssertionError("the C library was loaded off glibc")

    monkeypatch.setattr(malloc, "_settled", False)
    monkeypatch.setattr(malloc, "is_glibc", lambda: False)
    monkeypatch.setattr(malloc.ctypes, "CDLL", no_libc)
    assert malloc.settle() is False
    assert malloc.settle() is False


def test_is_glibc_agrees_with_the_platform_module():
    import platform

    assert malloc.is_glibc() == (platform.libc_ver()[0] == "glibc")
