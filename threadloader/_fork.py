"""Locks made anew in a forked child.

A child forked while another thread of the parent held one of them would
start with it held for ever (the forking thread is the only one there), and
its first use would hang: a ``worker_processes`` loader (or a DataLoader)
started with ``fork`` while another loader's threads run, say. Module-level
locks are named by module (:func:`renew_after_fork`), an object's own locks by
the object (:func:`renew_lock_after_fork`, held weakly). The buffer pools reset
more than their lock and register their own hook (:mod:`threadloader._pool`).
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from typing import Any

__all__ = ["renew_after_fork", "renew_lock_after_fork"]


def renew_after_fork(module_name: str, *names: str) -> None:
    """Give the ``threading.Lock`` attributes ``names`` of module ``module_name`` new locks in every forked child."""
    if not hasattr(os, "register_at_fork"):  # no fork on this platform
        return
    module = sys.modules[module_name]

    def renew() -> None:
        for name in names:
            setattr(module, name, threading.Lock())

    os.register_at_fork(after_in_child=renew)


#: Objects whose lock attributes are renewed in a forked child, with those attributes' names.
_object_locks: "weakref.WeakKeyDictionary[Any, tuple[str, ...]]" = weakref.WeakKeyDictionary()
_object_locks_guard = threading.Lock()


def renew_lock_after_fork(obj: Any, *names: str) -> None:
    """Give ``obj``'s ``threading.Lock`` attributes ``names`` new locks in every forked child, while ``obj`` lives."""
    with _object_locks_guard:
        _object_locks[obj] = names


def _renew_object_locks() -> None:
    global _object_locks_guard
    _object_locks_guard = threading.Lock()  # may itself have been held by another thread at the fork
    for obj, names in list(_object_locks.items()):
        for name in names:
            setattr(obj, name, threading.Lock())


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_object_locks)
