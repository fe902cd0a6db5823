"""Shared fixtures: every test must leave no worker thread behind."""

from __future__ import annotations

import gc
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
# The second and third CI suites (.ci/interpreter-selection) draw fewer
# examples: each property is drawn in full by the first suite.
settings.register_profile("ci-few", parent=settings.get_profile("ci"), max_examples=10)
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


_last_module: list[object] = [None]


def collect_what_the_test_left(module: object) -> None:
    """Collect the reference cycles a test left: a loader dropped in one stops its threads then.

    A full collection walks every object, which is slow with torch imported.
    Done after each test, it would take a large share of the suite's time.
    So what survives is frozen (``gc.freeze``) and the next test's collection
    walks only the objects made since. Everything is walked again after the
    first test of each module (module-scoped fixtures let go of theirs by then)
    and whenever a worker thread is still running (whatever holds it in a
    cycle, however old, is then collected too).
    """
    if module is not _last_module[0] or worker_threads():
        _last_module[0] = module
        gc.unfreeze()
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def no_leaked_threads(request: pytest.FixtureRequest):
    yield
    collect_what_the_test_left(request.node.module)
    leaked = wait_no_worker_threads()
    assert not leaked, f"leaked worker threads: {leaked}"


@pytest.fixture(scope="module")
def multiprocessing_warmed_up():
    """What multiprocessing opens once per process, opened before the per-test baselines of ``no_leaks``.

    The resource tracker with its pipe (the spawn start method), the
    forkserver and its pipe, and the resource sharer: its listening socket
    opens when this process first sends a tensor to a worker process (here
    DataLoader's index, a tensor).
    """
    from multiprocessing import forkserver, resource_tracker

    import torch
    from helpers import Squares

    from threadloader import ThreadDataLoader

    resource_tracker.ensure_running()
    forkserver.ensure_running()
    list(ThreadDataLoader(Squares(4), batch_size=2, num_workers=2, worker_processes=2,
                          multiprocessing_context="fork"))
    list(torch.utils.data.DataLoader(Squares(2), batch_sampler=[torch.tensor([0, 1])], num_workers=1,
                                     multiprocessing_context="fork"))
    gc.collect()
    yield


@pytest.fixture
def no_leaks(multiprocessing_warmed_up):
    """Fail the test if a child process, worker thread, file descriptor or /dev/shm entry outlives it.

    A module asks for it with ``pytestmark = pytest.mark.usefixtures("no_leaks")``.
    """
    from helpers import child_processes, open_fds, shm_entries, wait_until

    gc.collect()
    children, fds, shm = child_processes(), open_fds(), shm_entries()
    yield
    gc.collect()
    assert wait_until(lambda: len(child_processes()) <= len(children)), f"leaked processes: {child_processes()}"
    assert not wait_no_worker_threads()
    assert wait_until(lambda: open_fds() <= fds), f"leaked file descriptors: {open_fds() - fds}"
    assert wait_until(lambda: shm_entries() <= shm), f"leaked shared memory: {shm_entries() - shm}"


def pytest_unconfigure(config: pytest.Config) -> None:
    gc.unfreeze()  # what the last module left in cycles is collected before the interpreter ends
    gc.collect()
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
