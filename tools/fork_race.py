"""Count children that hang in CPython's after-fork clean-up (CPython gh-112275).

On CPython 3.8 to 3.11.9 a child forked while another thread holds the interpreter's
thread-list lock waits on that lock for ever (``PyOS_AfterFork_Child`` ->
``_PyEval_ReInitThreads`` -> ``_PyThreadState_DeleteExcept``). In 3.11's source, a
Python thread takes that lock only while holding the GIL, and the forking thread
holds the GIL. So the holder is a thread without the GIL, such as a native thread
entering Python (``PyGILState_Ensure`` makes its thread state under the lock).
This tool counts the children that hang, in one of three settings:

  native  N forks (a child that has not exited within 5 s counts as hung) while a
          helper thread keeps starting native threads (``pthread_create`` through
          ctypes) that call into Python: the bug's trigger.
  loader  N forks, each right after a ThreadDataLoader epoch (4 threads started,
          joined): the question whether our threads' ends are a trigger.
  guard   the native setting, with N ThreadDataLoader epochs of worker_processes=2
          forked children in place of bare forks: counts the children the pool's
          guard killed and forked again, and the epochs that failed.

Usage: python tools/fork_race.py native|loader|guard N [--gdb]
(--gdb prints the first hung child's native stack, where gdb is installed.)
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
import time


def _native_threads_entering_python(stop: threading.Event) -> None:
    libc = ctypes.CDLL(None)
    callback = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(lambda _arg: None)
    handle = ctypes.c_ulong()
    while not stop.is_set():
        if libc.pthread_create(ctypes.byref(handle), None, callback, None) == 0:
            libc.pthread_join(handle, None)


def _fork_and_wait(show_stack: bool) -> bool:
    """Fork a child that exits at once; return whether it did within 5 s."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0]:
            return True
        time.sleep(0.001)
    if show_stack and shutil.which("gdb"):
        subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "bt"], check=False)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return False


def _guarded_epochs(epochs: int) -> int:
    import warnings

    from threadloader import ThreadDataLoader

    loader = ThreadDataLoader(list(range(8)), batch_size=4, num_workers=2, worker_processes=2,
                              multiprocessing_context="fork")
    failed = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(epochs):
            try:
                for _batch in loader:
                    pass
            except RuntimeError:
                failed += 1
    forked_again = sum("forked again" in str(w.message) for w in caught)
    print(f"CPython {sys.version.split()[0]}, guard: {epochs} epochs ({2 * epochs} forks at least), "
          f"{forked_again} children hung and forked again, {failed} epochs failed")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("native", "loader", "guard"):
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    mode, forks, gdb = argv[0], int(argv[1]), "--gdb" in argv
    hung = 0
    if mode in ("native", "guard"):
        stop = threading.Event()
        churn = threading.Thread(target=_native_threads_entering_python, args=(stop,))
        churn.start()
        try:
            if mode == "guard":
                return _guarded_epochs(forks)
            for _ in range(forks):
                hung += not _fork_and_wait(gdb and not hung)
        finally:
            stop.set()
            churn.join()
    else:
        from threadloader import ThreadDataLoader

        loader = ThreadDataLoader(list(range(64)), batch_size=4, num_workers=4)
        for _ in range(forks):
            for _batch in loader:
                pass
            hung += not _fork_and_wait(gdb and not hung)
    print(f"CPython {sys.version.split()[0]}, {mode}: {forks} forks, {hung} children hung")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
