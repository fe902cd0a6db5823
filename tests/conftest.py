"""Shared fixtures: every test must leave no worker thread behind."""

from __future__ import annotations

import signal
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("ci")

# A shell starting the suite in the background without job control (`cmd &`
# in a script, nohup) hands it SIGINT ignored, and every process it starts
# inherits that: the Ctrl-C tests (tests/test_process_exit.py, test_procs.py)
# would find neither DataLoader's workers nor ours interruptible. Ctrl-C is
# what they test, so the suite always runs with Python's own handler.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("threadloader-")]


def wait_no_worker_threads(timeout: float = 5.0) -> list[threading.Thread]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = worker_threads()
        if not alive:
            return []
        time.sleep(0.01)
    return worker_threads()


@pytest.fixture(autouse=True)
def no_leaked_threads():
    yield
    import gc

    gc.collect()
    leaked = wait_no_worker_threads()
    assert not leaked, f"leaked worker threads: {leaked}"


def pytest_unconfigure(config: pytest.Config) -> None:
    # Tests that pickle shared tensors in this process (tests/test_arena.py
    # plays a child's part) start multiprocessing's resource sharer, a daemon
    # thread serving file descriptors to other processes. Stop it, so that the
    # interpreter exits with no thread of ours running: free-threaded 3.13t
    # once died of SIGSEGV at exit after the suite passed (not reproduced in
    # 5 runs since; daemon threads during finalization are its known weak spot).
    from multiprocessing import resource_sharer

    resource_sharer.stop(timeout=5)
    # tqdm (Lightning's progress bar, the bench's) starts a daemon monitor
    # thread at its first bar and never stops it: it was the one thread left
    # running at exit in a run on torch 2.15.0.
    tqdm = getattr(sys.modules.get("tqdm"), "tqdm", None)
    monitor = getattr(tqdm, "monitor", None)
    if monitor is not None:
        monitor.exit()
    # Name what is still running as the interpreter starts to finalize: the
    # next crash at exit (if any) then points at a thread, with the
    # tracebacks PYTHONFAULTHANDLER=1 prints (.ci/free-threaded sets it).
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive()]
    if others:
        print(f"\nthreads still running at the end of the session: {others}", file=sys.stderr)
