"""A process-like view of a worker thread, for code written against DataLoader's workers.

DataLoader's iterator keeps its worker *processes* in ``_workers``; tests and
tools check them after ``del`` or an error (``is_alive()``, ``join()``,
``exitcode``, ``pid``). :class:`WorkerThreadView` answers the same questions
about a worker thread, so such checks run for real instead of failing on a
missing attribute.
"""

from __future__ import annotations

import os
import threading

__all__ = ["WorkerThreadView"]


class WorkerThreadView:
    """``multiprocessing.Process``-like read-only view of one worker thread.

    ``pid`` is the process the thread runs in (what ``os.getpid()`` returns
    inside the worker). ``exitcode`` is None while the thread runs (or before
    it started) and 0 once it ended: a worker thread reports failures to the
    consumer as exceptions, never through an exit status.
    """

    __slots__ = ("_thread",)

    def __init__(self, thread: threading.Thread) -> None:
        self._thread = thread

    @property
    def name(self) -> str:
        return self._thread.name

    @property
    def pid(self) -> int:
        return os.getpid()

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    @property
    def native_id(self) -> int | None:
        return self._thread.native_id

    @property
    def daemon(self) -> bool:
        return self._thread.daemon

    @property
    def exitcode(self) -> int | None:
        if self._thread.ident is None or self._thread.is_alive():
            return None
        return 0

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        """Wait until the thread ends, at most ``timeout`` seconds (as ``Process.join``)."""
        if self._thread.ident is None:
            raise AssertionError("can only join a started process")
        self._thread.join(timeout)

    def terminate(self) -> None:
        """Nothing to do: a thread cannot be killed from outside.

        Worker threads stop when their iterator shuts down (exhaustion,
        ``del``, garbage collection, interpreter exit); DataLoader users call
        ``terminate()`` in clean-up code, which therefore stays harmless.
        """

    kill = terminate

    def __repr__(self) -> str:
        state = "started" if self._thread.is_alive() else ("initial" if self._thread.ident is None else "stopped")
        return f"<WorkerThreadView name={self.name!r} {state}>"
