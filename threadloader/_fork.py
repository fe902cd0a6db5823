"""Module-level locks made anew in a forked child.

A child forked while another thread of the parent held one of them would
start with it held for ever (the forking thread is the only one there), and
its first use would hang: a ``worker_processes`` loader (or a DataLoader)
started with ``fork`` while another loader's threads run, say. The buffer
pools reset more than their lock and register their own hook
(:mod:`threadloader._pool`).
"""

from __future__ import annotations

import os
import sys
import threading

__all__ = ["renew_after_fork"]


def renew_after_fork(module_name: str, *names: str) -> None:
    """Give the ``threading.Lock`` attributes ``names`` of module ``module_name`` new locks in every forked child."""
    if not hasattr(os, "register_at_fork"):  # no fork on this platform
        return
    module = sys.modules[module_name]

    def renew() -> None:
        for name in names:
            setattr(module, name, threading.Lock())

    os.register_at_fork(after_in_child=renew)
