"""A one-way queue between two processes: :class:`PipeQueue`, written straight to its pipe.

``multiprocessing.Queue`` hands every ``put`` to a feeder thread, which
pickles the message and writes it: each message wakes that thread, a
context switch and a GIL hand-off per task, on both sides (a child's jobs
and its results). Here ``put`` pickles the message and writes it to the
pipe itself, without blocking (the write end is non-blocking). When the
pipe is full (a reader busy with a long task, big messages), what did not
fit waits in a backlog that a writer thread drains; later messages go
behind it, so the reader reads them in order. ``put`` never blocks, as with
``multiprocessing.Queue``.

One process writes (from any of its threads) and one thread of another
reads. Messages are framed as ``multiprocessing.connection.Connection``
frames them: the reader reads them with :meth:`PipeQueue.get`.
"""

from __future__ import annotations

import collections
import os
import queue
import select
import struct
import threading
from multiprocessing import context as mp_context
from multiprocessing.reduction import ForkingPickler
from typing import Any

__all__ = ["PipeQueue"]

#: How often the writer thread, waiting for room in the pipe, checks whether the queue was closed (seconds).
_WRITER_POLL_S = 0.1


def _frame(data: Any) -> bytes:
    """``data`` with ``Connection.send_bytes``' header: its length, as ``recv_bytes`` reads it."""
    n = len(data)
    header = struct.pack("!i", n) if n <= 0x7FFFFFFF else struct.pack("!iQ", -1, n)
    return header + data


class PipeQueue:
    """Messages from one process (which puts) to another (which gets).

    A child's jobs go from the loader's process to the child; its results come back.

    Nothing that may start a garbage collection runs while the lock is held
    for a write, and the lock is reentrant: a collection's finalizer (a
    dropped iterator's pool stopping) may put on this queue from any thread,
    the writer thread too. A frame joins the backlog before it is written, so
    a put made meanwhile queues behind it.

    Args:
        ctx: the multiprocessing context the child starts in (its pipe).
    """

    def __init__(self, ctx: Any) -> None:
        self.reader, self.writer = ctx.Pipe(duplex=False)
        os.set_blocking(self.writer.fileno(), False)
        self.begin_writing()

    def begin_writing(self) -> None:
        """Make this process the writing one: call it in a forked child that puts (a spawned one needs nothing).

        A forked copy holds the parent's lock, backlog and writer thread as they were.
        """
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
        return self.reader, self.writer

    def __setstate__(self, state: tuple[Any, Any]) -> None:
        self.reader, self.writer = state
        self.begin_writing()

    @property
    def writer_thread(self) -> threading.Thread | None:
        """The thread that drains the backlog, once a full pipe needed one."""
        return self._thread

    def put(self, obj: Any) -> None:
        """Send ``obj`` to the reading process; never blocks. Dropped if that process is gone (its reader end closed).

        Raises:
            ValueError: the queue was closed.
        """
        frame = _frame(ForkingPickler.dumps(obj))
        with self._lock:
            if self._closed:
                raise ValueError("the queue is closed")
            backlog = self._backlog
            backlog.append(frame)
            if len(backlog) == 1:  # nothing before it: write it now, as much as the pipe takes
                self._offset = 0
                try:
                    sent = os.write(self.writer.fileno(), frame)
                except BlockingIOError:
                    sent = 0
                except BrokenPipeError:  # the reader is gone: nothing reaches it any more
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
            self._thread = threading.Thread(target=self._drain, name="threadloader-pipe-writer", daemon=True)
            self._thread.start()
        self._ready.set()

    def _drain(self) -> None:
        """The writer thread: write the backlog as the pipe makes room, until the queue is closed."""
        with self._lock:  # close() may have come first (a collection on the putting thread): its ends are gone
            if self._closed:
                return
            fd = self.writer.fileno()
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
            except OSError:  # the reader is gone (EPIPE), or the end was closed: nothing more goes out
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

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """The next message (in the reading process), as ``multiprocessing.Queue.get`` gives it.

        A frame begun is read whole: its writer finishes it, or its end closes.

        Raises:
            queue.Empty: none came within ``timeout`` seconds (at once when not ``block``).
            EOFError: every write end closed (its writer died) before a whole message came.
        """
        if not block:
            timeout = 0.0
        if timeout is not None and not self.reader.poll(max(0.0, timeout)):
            raise queue.Empty
        return ForkingPickler.loads(self.reader.recv_bytes())

    def empty(self) -> bool:
        """Whether nothing is there to read now (in the reading process)."""
        return not self.reader.poll()

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
        for end in (self.writer, self.reader):
            end.close()
