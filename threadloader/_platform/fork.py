"""What a forked child must not keep as it was: locks held by other threads, pipe ends it must not hold.

A child forked while another thread of the parent held one of our locks would
start with it held for ever (the forking thread is the only one there). Its
first use would hang. This happens, say, to a ``worker_processes`` loader (or a
DataLoader) started with ``fork`` while another loader's threads run.
Module-level locks are named by module (:func:`renew_after_fork`). An object's
own locks are named by the object (:func:`renew_lock_after_fork`, held
weakly). Each is renewed as its own kind (a reentrant lock stays reentrant).
The buffer pools reset
more than their lock and register their own hook (:mod:`threadloader.images.buffers`).

A forked child also holds a copy of every file descriptor open at the fork.
For a moment, these include the write end of another ``worker_processes``
child's result pipe: from the pipe's creation to its close in the parent, once
its own child has started. A child forked in that moment (another pool
starting in another thread, a DataLoader, ``os.fork``) would keep that pipe
open. The receiver of a child killed in the middle of a message would then
wait for the rest for ever instead of reading end of file. So such
descriptors are registered (:func:`private_fd`). In every forked child but the
one they are for (:func:`forking_for`), they are pointed at ``/dev/null``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import weakref
from typing import Any, Iterator

__all__ = ["forking_for", "forking_own_child", "forks", "private_fd", "release_private_fd", "renew_after_fork",
           "renew_lock_after_fork"]

#: How many forks lie between this process and the one that imported this
#: module. An object made before a fork tells it is a forked child's copy by
#: this number, read without a system call (``os.getpid()`` is one).
forks = 0


#: Objects (modules too) whose lock attributes are renewed in a forked child, with those attributes' names.
_object_locks: "weakref.WeakKeyDictionary[Any, tuple[str, ...]]" = weakref.WeakKeyDictionary()
#: File descriptor -> the owner (a token) of the one forked child that may keep it.
_private_fds: dict[int, object] = {}
#: Guards both registries (renewed in a child: another thread may have held it at the fork).
_guard = threading.Lock()
_forking = threading.local()
_RLock = type(threading.RLock())


def renew_after_fork(module_name: str, *names: str) -> None:
    """Give the lock attributes ``names`` of module ``module_name`` new locks in every forked child."""
    renew_lock_after_fork(sys.modules[module_name], *names)


def renew_lock_after_fork(obj: Any, *names: str) -> None:
    """Give ``obj``'s lock attributes ``names`` new locks in every forked child, while ``obj`` lives.

    Each is renewed as its kind: ``threading.RLock`` or ``threading.Lock``.
    """
    with _guard:
        _object_locks[obj] = names


def private_fd(fd: int, owner: object) -> None:
    """Register ``fd`` as one that only ``owner``'s child may inherit (see the module's docstring)."""
    with _guard:
        _private_fds[fd] = owner


def release_private_fd(fd: int) -> None:
    """Unregister ``fd``; call it *before* closing ``fd`` (once closed, its number may name another file)."""
    with _guard:
        _private_fds.pop(fd, None)


@contextlib.contextmanager
def forking_for(owner: object) -> Iterator[None]:
    """Within this block, a fork made by this thread is ``owner``'s child: it keeps ``owner``'s descriptors."""
    _forking.owner = owner
    try:
        yield
    finally:
        _forking.owner = None


def forking_own_child() -> bool:
    """Whether a fork by this thread now starts a child of ours (within :func:`forking_for`)."""
    return getattr(_forking, "owner", None) is not None


def _after_fork_in_child() -> None:
    global _guard, forks
    forks += 1
    _guard = threading.Lock()
    for obj, names in list(_object_locks.items()):
        for name in names:
            kind = threading.RLock if isinstance(getattr(obj, name), _RLock) else threading.Lock
            setattr(obj, name, kind())
    _drop_private_fds()


def _drop_private_fds() -> None:
    mine = getattr(_forking, "owner", None)  # the forking thread's (thread-locals survive in the child)
    others = [fd for fd, owner in _private_fds.items() if owner is not mine]
    _private_fds.clear()  # the parent's registrations, not this child's
    if not others:
        return
    # Pointed at /dev/null, not closed: the objects holding these numbers live
    # on in the child's copy of the parent's memory, and a later close of
    # theirs must not hit a file the child opened with a reused number.
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in others:
            with contextlib.suppress(OSError):
                os.dup2(null, fd)
    finally:
        os.close(null)


if hasattr(os, "register_at_fork"):  # no fork on other platforms
    os.register_at_fork(after_in_child=_after_fork_in_child)
