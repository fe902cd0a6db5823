"""glibc's malloc thresholds, raised once per process before worker threads start.

glibc gives each thread that allocates an arena of its own. Two thresholds
start low (128 KiB): a block above the mmap threshold is mapped and unmapped
on each allocation, and an arena whose free top passes the trim threshold
gives those pages back. A thread that allocates and frees a few MiB per
sample (a convolution's buffers, a resized image) then touches fresh pages,
hundreds of page faults, on every sample; two such threads of one process
(not two processes) each pay it. glibc raises both thresholds itself the
first time the program frees a mapped block (up to 32 MiB); a program whose
big blocks are only its workers' may never do so.

:func:`settle` does what glibc would do then: it allocates and frees one
mapped block of :data:`THRESHOLD` bytes. The mmap threshold becomes that
size and the trim threshold twice it, for the whole process; no page is
touched. A user who fixed the thresholds (``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TRIM_THRESHOLD_`` or ``GLIBC_TUNABLES``) keeps them: glibc no
longer moves them then. Elsewhere (musl, macOS, Windows, or another
allocator preloaded) nothing changes that matters.
"""

from __future__ import annotations

import ctypes
import os
import threading

__all__ = ["THRESHOLD", "is_glibc", "settle"]

#: The block :func:`settle` allocates and frees: glibc's mmap threshold from then on (its trim threshold twice it).
THRESHOLD = 16 << 20

_lock = threading.Lock()
_settled = False  # a forked child inherits it with the thresholds it stands for


def is_glibc() -> bool:
    """Whether this process runs on glibc."""
    try:
        return bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (AttributeError, ValueError, OSError):  # no confstr (Windows), or the name is unknown (musl, macOS)
        return False


def settle() -> bool:
    """Raise glibc's malloc thresholds to :data:`THRESHOLD` as glibc itself does after a big block is freed.

    Once per process; thread-safe.

    Returns:
        True when it allocated and freed the block now; False when it did
        before in this process, or the C library is not glibc.
    """
    global _settled
    with _lock:
        if _settled:
            return False
        _settled = True
        if not is_glibc():
            return False
        # A CDLL of its own: the argument types set here are not seen by other users of ctypes.
        libc = ctypes.CDLL(None)
        libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
        libc.free.restype, libc.free.argtypes = None, [ctypes.c_void_p]
        block = libc.malloc(THRESHOLD)
        if block:
            libc.free(block)
        return True
