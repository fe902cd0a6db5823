"""Facts about the running CPython that change how threads behave.

A free-threaded build (``--disable-gil``, PEP 703) can run with the GIL off,
and it frees objects differently: an object is owned by the thread that made
it, and when another thread drops the last reference, the owner frees it the
next time it runs Python code (biased reference counting). The engine needs
to know this to keep idle worker threads from holding on to batches.
"""

from __future__ import annotations

import sys
import sysconfig

__all__ = ["FREE_THREADED_BUILD", "gil_enabled"]

#: True on a CPython built with ``--disable-gil``, whether or not the GIL was
#: switched back on at run time (``PYTHON_GIL=1``, or an extension module that
#: does not declare itself GIL-free).
FREE_THREADED_BUILD: bool = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


def gil_enabled() -> bool:
    """False only on a free-threaded Python running with the GIL disabled."""
    is_enabled = getattr(sys, "_is_gil_enabled", None)
    return True if is_enabled is None else bool(is_enabled())
