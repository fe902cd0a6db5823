"""Keep torch's intra-op parallelism from multiplying by the number of worker threads.

With the OpenMP backend (torch's Linux builds), every thread that runs a
parallel torch op becomes the master of its own OpenMP team of
``torch.get_num_threads()`` threads: 16 worker threads normalizing batches on
a 16-core machine start 16 x 15 extra OS threads fighting for 16 cores.
``torch.set_num_threads(1)`` would fix that for the workers but also for the
training loop: it stores a process-wide value.

:func:`limit_this_thread` makes torch ops called *from the calling thread*
single-threaded and leaves every other thread (the main thread included) as
it is. It first lets torch run its lazy per-thread initialisation. (The first
``torch.get_num_threads()`` in a thread copies the process-wide value into the
thread's OpenMP state; run later, it would undo ours.) Then it sets that
thread's OpenMP ``nthreads-var`` to 1 with ``omp_set_num_threads``, a
per-thread setting in OpenMP. It does so on each OpenMP runtime loaded in the
process (torch's bundled libgomp, or libiomp/libomp). With torch's native
thread pool (no OpenMP) there is one pool for the whole process: nothing
multiplies, and nothing is changed.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from typing import Any

import torch

from .._platform.fork import renew_after_fork

__all__ = ["limit_this_thread", "openmp_runtimes"]

_lock = threading.Lock()
renew_after_fork(__name__, "_lock")
_runtimes: list[Any] | None = None

# OpenMP runtimes that torch (or a library beside it) may have loaded.
_OPENMP_NAMES = ("libgomp", "libiomp5", "libomp")


def _loaded_openmp_paths() -> list[str]:
    """Paths of the OpenMP runtimes mapped into this process (Linux: /proc/self/maps)."""
    paths: list[str] = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(None, 5)[-1] if line.count(" ") >= 5 else ""
                base = os.path.basename(path)
                if base.startswith(_OPENMP_NAMES) and ".so" in base and path not in paths:
                    paths.append(path)
    except OSError:  # no /proc (macOS, Windows)
        pass
    return paths


def openmp_runtimes() -> list[Any]:
    """The loaded OpenMP runtimes that export ``omp_set_num_threads`` (ctypes handles, cached)."""
    global _runtimes
    with _lock:
        if _runtimes is None:
            found = []
            candidates: list[str | None] = _loaded_openmp_paths()
            if not candidates and sys.platform != "win32":
                candidates = [None]  # the global namespace (macOS: libomp loaded by torch)
            for path in candidates:
                try:
                    lib = ctypes.CDLL(path)  # already loaded: same handle, nothing new mapped
                    fn = lib.omp_set_num_threads
                except (OSError, AttributeError):
                    continue
                fn.argtypes, fn.restype = [ctypes.c_int], None
                found.append(fn)
            _runtimes = found
        return _runtimes


def _backend_is_openmp() -> bool:
    return "parallel backend: OpenMP" in torch.__config__.parallel_info()


_openmp_backend: bool | None = None


def limit_this_thread() -> bool:
    """Make torch ops run from the calling thread use one intra-op thread.

    Other threads, the main thread included, keep their setting. Call it once
    at the start of a worker thread, before its first torch op.

    Returns:
        True when the calling thread now reports ``torch.get_num_threads() == 1``.
    """
    global _openmp_backend
    if _openmp_backend is None:
        _openmp_backend = _backend_is_openmp()
    # Runs torch's lazy per-thread init now, so it cannot overwrite the
    # setting below later.
    if torch.get_num_threads() == 1:
        return True
    if not _openmp_backend:
        # torch's own pool: one per process, shared by all threads; the
        # value is process-wide, so leave it.
        return False
    for set_num_threads in openmp_runtimes():
        set_num_threads(1)
    return torch.get_num_threads() == 1
