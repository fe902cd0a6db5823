"""limit_this_thread: torch ops in a worker thread use one intra-op thread; other threads keep theirs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

# Run in a fresh interpreter: it sets torch's process-wide thread count to 4
# (so that fan-out is visible on any machine) without touching this one's.
_SCRIPT = textwrap.dedent(
    """
    import json, os, threading
    import torch
    from threadloader.worker.intraop import limit_this_thread

    torch.set_num_threads(4)
    big = torch.ones(4_000_000)
    big.add(1)  # the main thread's OpenMP team exists now

    def tasks():
        return len(os.listdir("/proc/self/task"))

    def worker(limit, out):
        out["limited"] = limit_this_thread() if limit else None
        out["threads"] = torch.get_num_threads()
        before = tasks()
        for _ in range(3):
            big.add(1)  # a parallel op: would start a team of get_num_threads() threads
        img = torch.zeros((1, 3, 375, 500), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
        torch.nn.functional.interpolate(img, size=(224, 224), mode="bilinear", antialias=True)
        out["spawned"] = tasks() - before

    result = {}
    for name, limit in (("limited", True), ("control", False)):
        out = {}
        t = threading.Thread(target=worker, args=(limit, out))
        t.start()
        t.join()
        result[name] = out
    result["main"] = torch.get_num_threads()
    print(json.dumps(result))
    """
)


def _parallel_backend_is_openmp() -> bool:
    return "parallel backend: OpenMP" in torch.__config__.parallel_info()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts OS threads through /proc")
@pytest.mark.skipif(not _parallel_backend_is_openmp(), reason="torch's native pool is not per thread")
def test_limit_this_thread_single_threads_the_caller_only() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    # Without the call a worker thread fans out over its own OpenMP team...
    assert r["control"]["threads"] == 4 and r["control"]["spawned"] >= 1, r
    # ...with it, the thread reports 1 and starts no OS thread for its ops,
    assert r["limited"] == {"limited": True, "threads": 1, "spawned": 0}, r
    # and the main thread's setting is untouched.
    assert r["main"] == 4


def test_limit_this_thread_leaves_the_calling_process_usable() -> None:
    import threading

    from threadloader.worker.intraop import limit_this_thread

    main_before = torch.get_num_threads()
    out = {}

    def worker() -> None:
        out["ok"] = limit_this_thread()
        out["n"] = torch.get_num_threads()
        out["sum"] = float(torch.ones(1000).sum())

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert out["sum"] == 1000.0
    if _parallel_backend_is_openmp():
        assert out == {"ok": True, "n": 1, "sum": 1000.0}
    assert torch.get_num_threads() == main_before
