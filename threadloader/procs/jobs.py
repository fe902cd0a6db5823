"""A child's job queue: :class:`JobQueue`, written straight to the pipe, by a thread only when the pipe is full.

``multiprocessing.Queue`` hands every ``put`` to a feeder thread, which
pickles the message and writes it: the consumer wakes that thread once per
job, a context switch and a GIL hand-off on every task. Here ``put`` pickles
the message and writes it to the pipe itself, without blocking (the write
end is non-blocking). When the pipe is full (a child busy with a long task,
big jobs), what did not fit waits in a backlog that a writer thread drains;
later messages go behind it, so the child reads them in order. ``put`` never
blocks, as with ``multiprocessing.Queue``.

Messages are framed as ``multiprocessing.connection.Connection`` frames them,
so the child reads them with :meth:`JobQueue.get` from its end of the pipe.
"""

from __future__ import annotations

import collections
import os
import select
import struct
import threading
from multiprocessing import context as mp_context
from multiprocessing.reduction import ForkingPickler
from typing import Any

__all__ = ["JobQueue"]

#: How often the writer thread, waiting for room in the pipe, checks whether the queue was closed (seconds).
_WRITER_POLL_S = 0.1


def _frame(data: Any) -> bytes:
    """``data`` with ``Connection.send_bytes``' header: its length, as ``recv_bytes`` reads it."""
    n = len(data)
    header = struct.pack("!i", n) if n <= 0x7FFFFFFF else struct.pack("!iQ", -1, n)
    return header + data


class JobQueue:
    """One child's jobs: the loader's process puts, the child gets.

    Nothing that may start a garbage collection runs while the lock is held
    for a write, and the lock is reentrant: a collection's finalizer (a
    dropped iterator's pool stopping) may put on this queue from any thread,
    the writer thread too. A frame joins the backlog before it is written, so
    a put made meanwhile queues behind it.

    Args:
        ctx: the multiprocessing context the child starts in (its pipe).
    """

    def __init__(self, ctx: Any) -> None:
        self.reader, self._writer = ctx.Pipe(duplex=False)
        os.set_blocking(self._writer.fileno(), False)
        self._writing_side()

    def _writing_side(self) -> None:
        self._owner = os.getpid()
        self._lock = threading.RLock()
        self._ready = threading.Event()  # the backlog may have something to write
        self._backlog: collections.deque = collections.deque()  # frames not wholly written yet, in order
        self._offset = 0  # bytes of the backlog's first frame written already
        self._started = False
        self._thread: threading.Thread | None = None
        self._closed = False

    def __getstate__(self) -> tuple[Any, Any]:
        # Sent to a spawned or forkserver child, as multiprocessing's queues are.
        mp_context.assert_spawning(self)
        return self.reader, self._writer

    def __setstate__(self, state: tuple[Any, Any]) -> None:
        self.reader, self._writer = state
        self._writing_side()

    @property
    def writer_thread(self) -> threading.Thread | None:
        """The thread that drains the backlog, once a full pipe needed one."""
        return self._thread

    def put(self, obj: Any) -> None:
        """Send ``obj`` to the child; never blocks. Dropped if the child is gone (its receiver reports that).

        Raises:
            ValueError: the queue was closed.
        """
        frame = _frame(ForkingPickler.dumps(obj))
        with self._lock:
            if self._closed:
                raise ValueError("the job queue is closed")
            backlog = self._backlog
            backlog.append(frame)
            if len(backlog) == 1:  # nothing before it: write it now, as much as the pipe takes
                self._offset = 0
                try:
                    sent = os.write(self._writer.fileno(), frame)
                except BlockingIOError:
                    sent = 0
                except BrokenPipeError:  # the child is gone: nothing reaches it any more
                    backlog.clear()
                    return
                if sent == len(frame):
                    backlog.popleft()  # its own frame: a put made meanwhile queued behind it
                else:
                    self._offset = sent
            if not backlog:
                return
            start = not self._started
            self._started = True
        if start:
            self._thread = threading.Thread(target=self._drain, name="threadloader-jobs", daemon=True)
            self._thread.start()
        self._ready.set()

    def _drain(self) -> None:
        """The writer thread: write the backlog as the pipe makes room, until the queue is closed."""
        fd = self._writer.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        while True:
            self._ready.wait()
            with self._lock:
                if self._closed:
                    return
                if not self._backlog:
                    self._ready.clear()
                    continue
                head = self._backlog[0]
                offset = self._offset
            if not poller.poll(_WRITER_POLL_S * 1000):
                continue  # still full: check for close again
            try:
                sent = os.write(fd, memoryview(head)[offset:])
            except BlockingIOError:
                continue
            except OSError:  # the child is gone (EPIPE), or the end was closed: nothing more goes out
                with self._lock:
                    self._backlog.clear()
                continue
            with self._lock:
                # Puts only queue while the backlog holds anything: its head is still ``head``
                # (unless close() emptied it).
                if self._backlog and self._backlog[0] is head:
                    if offset + sent == len(head):
                        self._backlog.popleft()
                        self._offset = 0
                    else:
                        self._offset = offset + sent

    def get(self) -> Any:
        """The next message (in the child), waiting for it.

        Raises:
            EOFError: the loader's process closed its end (it died) before a whole message came.
        """
        return ForkingPickler.loads(self.reader.recv_bytes())

    def cancel_join_thread(self) -> None:
        """Nothing to do: the writer thread never holds up this process's exit (``multiprocessing.Queue``'s API)."""

    def close(self) -> None:
        """Close this process's ends; the writer thread ends, what it had not written is dropped (idempotent)."""
        if os.getpid() == self._owner:
            with self._lock:
                self._closed = True
                self._backlog.clear()
            self._ready.set()
            thread = self._thread
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=2 * _WRITER_POLL_S)
        for end in (self._writer, self.reader):
            end.close()
