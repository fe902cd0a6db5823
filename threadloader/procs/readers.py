"""Waiting for data on several pipe ends at once, with one system call per wait.

``multiprocessing.connection.wait`` builds and tears down a selector on each
call, and a queue's ``get`` with a timeout waits through it: several system
calls and microseconds per message, paid on both sides of every task. A
:class:`Readers` keeps one ``select.poll`` set over the connections it
watches, so a wait is one ``poll``. Where ``select.poll`` is missing
(Windows) it waits through ``multiprocessing.connection.wait``.
"""

from __future__ import annotations

import select
from multiprocessing import connection as mp_connection
from typing import Any, Iterable

__all__ = ["Readers"]

#: Ready to read, or its other end closed (an end of file is read as one).
_EVENTS = (select.POLLIN | select.POLLPRI) if hasattr(select, "poll") else 0


class Readers:
    """Connections (or anything with ``fileno()``) whose data one thread waits for.

    Not thread-safe: one thread waits, adds and removes.

    Args:
        conns: the connections to watch first.
    """

    def __init__(self, conns: Iterable[Any] = ()) -> None:
        self._by_fd: dict[int, Any] = {}
        self._poll = select.poll() if hasattr(select, "poll") else None
        for conn in conns:
            self.add(conn)

    def __len__(self) -> int:
        return len(self._by_fd)

    def add(self, conn: Any) -> None:
        """Watch ``conn`` too."""
        fd = conn.fileno()
        self._by_fd[fd] = conn
        if self._poll is not None:
            self._poll.register(fd, _EVENTS)

    def remove(self, conn: Any) -> None:
        """Stop watching ``conn`` (idempotent; ``conn`` may be closed already)."""
        for fd, known in list(self._by_fd.items()):
            if known is conn:
                del self._by_fd[fd]
                if self._poll is not None:
                    self._poll.unregister(fd)

    def wait(self, timeout: float | None) -> list[Any]:
        """The connections with data to read (or closed at the other end), waiting up to ``timeout`` seconds.

        Raises:
            OSError, ValueError: a watched connection was closed in this process.
        """
        if self._poll is None:
            return list(mp_connection.wait(list(self._by_fd.values()), timeout))
        ms = None if timeout is None else max(0, int(timeout * 1000 + 0.999))
        while True:
            try:
                events = self._poll.poll(ms)
            except InterruptedError:  # pragma: no cover - PEP 475 retries poll itself
                continue
            return [self._by_fd[fd] for fd, _ in events if fd in self._by_fd]
