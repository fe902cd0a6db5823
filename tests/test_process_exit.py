"""Ctrl-C and interpreter exit never hang (run in a child process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

CHILD_SIGINT = textwrap.dedent(
    """
    import sys, time
    from torch.utils.data import Dataset
    from threadloader import ThreadDataLoader

    class Slow(Dataset):
        def __len__(self): return 10**6
        def __getitem__(self, i):
            time.sleep(0.01)
            return i

    loader = ThreadDataLoader(Slow(), batch_size=4, num_workers=2, persistent_workers={persistent})
    try:
        for i, batch in enumerate(loader):
            if i == 2:
                print("ready", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        raise
    """
)

CHILD_EXIT = textwrap.dedent(
    """
    import time
    from torch.utils.data import Dataset
    from threadloader import ThreadDataLoader

    class Slow(Dataset):
        def __len__(self): return 1000
        def __getitem__(self, i):
            time.sleep(0.05 if i > 5 else 0)
            return i

    loader = ThreadDataLoader(Slow(), batch_size=2, num_workers=2, persistent_workers=True)
    it = iter(loader)
    next(it)
    print("leaving", flush=True)
    """
)


def _env():
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.mark.parametrize("persistent", [False, True])
def test_sigint_exits_with_keyboard_interrupt_within_5s(persistent):
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD_SIGINT.format(persistent=persistent)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=5)
        assert time.monotonic() - t0 < 5
    finally:
        proc.kill()
    assert "interrupted" in out
    assert "KeyboardInterrupt" in err
    assert proc.returncode != 0


def test_interpreter_exit_with_persistent_workers_alive_does_not_hang():
    proc = subprocess.Popen([sys.executable, "-c", CHILD_EXIT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env())
    try:
        # Timed from the child's last line, not from its start: importing
        # torch alone can take a minute on a loaded machine (CPython 3.13t).
        assert proc.stdout.readline().strip() == "leaving"
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=20)
        assert time.monotonic() - t0 < 20
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    # The iterator collected at exit (module globals already None) says nothing.
    assert "Exception ignored" not in err and "Traceback" not in err, err


CHILD_MP_EXIT_WITH_LIVE_ITERATOR = textwrap.dedent(
    """
    import multiprocessing, sys, torch
    from torch.utils.data import Dataset
    from threadloader import ThreadDataLoader

    class Big(Dataset):
        def __len__(self): return 10**7
        def __getitem__(self, i): return 0
        def __getitems__(self, indices): return [0]  # each job costs its (large) index list only

    def body():
        loader = ThreadDataLoader(Big(), batch_size=10**6, num_workers=1, worker_processes=1,
                                  multiprocessing_context="fork")
        it = iter(loader)
        for _ in it:
            raise RuntimeError("leaving with the iterator alive")  # the traceback keeps `it`

    if __name__ == "__main__":
        p = multiprocessing.get_context("fork").Process(target=body)
        p.start()
        p.join(30)
        print("exited" if not p.is_alive() else "hung", p.exitcode, flush=True)
        if p.is_alive():
            p.kill()
    """
)


def test_a_process_exiting_with_a_live_worker_processes_iterator_does_not_hang(tmp_path):
    # multiprocessing's exit terminates the worker, then joins the job queue's
    # feeder thread, stuck writing a large index list nobody reads (pytorch#48666,
    # torch's test_large_sampler_indices): the queue must not be joined.
    script = tmp_path / "child.py"
    script.write_text(CHILD_MP_EXIT_WITH_LIVE_ITERATOR)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=_env())
    assert out.stdout.split() == ["exited", "1"], (out.stdout, out.stderr[-2000:])
