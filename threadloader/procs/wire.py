"""What travels between a ``worker_processes`` child and its parent, and how.

Jobs go to a child as ``(worker_id, (task, generation, index))`` on its job
queue (or :data:`NEW_EPOCH`, :data:`RELEASED`, or None to stop). Results come back as the thread
engine's messages ``(kind, generation, task, worker_id, payload)`` on its
result queue, where :class:`ParcelQueue` wraps a data payload as a
:class:`Parcel` (pickled on its own, so a payload that cannot be unpickled in
the parent is an error of its task, not of the whole channel) and the
exception that ended a worker thread as a :class:`Death` (whose message must
arrive whatever the exception holds). Tensors travel as shared-memory handles
(torch's reductions in ``ForkingPickler``), batches in the child's arena of
reused buffers by block id (:mod:`.arena`).

Both ways a message is plain tuples and ints (:func:`job_message`,
:func:`received`): a named tuple, an enum member or a class of ours pickles as
a reference the other side looks up and calls, microseconds per task.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from multiprocessing.reduction import ForkingPickler
from typing import Any

from .._platform.torch_compat import ExceptionWrapper
from ..engine.protocol import Job, Kind, Message
from ..worker import context as _context
from .arena import forking_dumps as _dumps
from .mirror import discard as arena_discard
from .mirror import loads as arena_loads

__all__ = ["NEW_EPOCH", "TOO_MANY_OPEN_FILES", "Death", "Parcel", "ParcelQueue", "ReceiveError",
           "WorkerExitStandIn", "job_message", "job_of", "out_of_fds", "received"]

#: Control messages on a child's job queue (besides ``(worker_id, job)`` and
#: None): ``(NEW_EPOCH, generation)``; ``(RELEASED, (block ids, forked ids))``,
#: arena blocks the loader's process let go of (``Mirror.take_released``).
NEW_EPOCH = -1
RELEASED = -2

#: A result's kind as it travels (its value) -> the :class:`Kind` it stands for.
_KINDS = {int(kind): kind for kind in Kind}
_DATA = int(Kind.DATA)


def job_message(worker_id: int, job: Job) -> tuple[int, tuple[int, int, Any]]:
    """How ``job`` for ``worker_id`` travels on a child's job queue (:func:`job_of` reads it there)."""
    return worker_id, tuple(job)  # type: ignore[return-value]


def job_of(sent: tuple[int, int, Any]) -> Job:
    """The :class:`Job` a job message carried (in the child)."""
    return Job._make(sent)


def received(sent: tuple[int, int, int, int, Any]) -> Message:
    """The :class:`Message` a child's :class:`ParcelQueue` sent (in the parent), a data payload as its :class:`Parcel`.

    Raises:
        Exception: not a message a child sends (the channel is broken).
    """
    kind, gen, idx, worker_id, payload = sent
    if kind == _DATA:
        payload = Parcel(*payload)
    return Message(_KINDS[kind], gen, idx, worker_id, payload)


class Parcel:
    """A result's payload, pickled on its own inside the result message.

    If the parent cannot unpickle the payload (a ``__reduce__`` that fails
    there, file descriptors running out while receiving a tensor...), the
    message around it still arrives, so the error belongs to its task and
    the channel stays usable, as in DataLoader, whose queue ``get`` raises the
    error while the worker goes on.

    Pickled by :meth:`seal` in the worker thread that made the payload, and
    unpickled by :meth:`open` in the parent's thread that hands it to the
    training loop (the consumer; the receiver only when it pins): on a
    free-threaded build an object is freed by the thread that made it, so a
    batch let go of in another thread (the training loop in the parent)
    would wait there for that thread's next bytecode before its arena block
    could be lent again.
    """

    __slots__ = ("data", "pid", "refs")

    def __init__(self, data: bytes, pid: int, refs: Any = None) -> None:
        self.data = data
        self.pid = pid
        self.refs = refs  # how to rebuild the arena tensors it references (see .arena.loads), or None

    @classmethod
    def seal(cls, payload: Any, worker_id: int, pid: int | None = None) -> "Parcel":
        """Pickle ``payload`` (in a child process); one that does not pickle becomes its task's error.

        Args:
            pid: this process's id (asked of the system when None).
        """
        pid = os.getpid() if pid is None else pid
        arena = _context.child_arena()
        try:
            data, refs = arena.dumps(payload) if arena is not None else (_dumps(payload), None)
        except Exception:  # noqa: BLE001 - unpicklable result: its task fails instead of never arriving
            where = f"in DataLoader worker thread {worker_id} (sending its result from process {pid})"
            data, refs = _dumps(ExceptionWrapper(where=where)), None
        return cls(data, pid, refs)

    def __reduce__(self) -> tuple[type, tuple[bytes, int, Any]]:
        return Parcel, (self.data, self.pid, self.refs)

    def discard(self) -> None:
        """Unpickle the payload and drop it, whatever fails (a result nobody will read: the pool stops).

        Shared memory torch sent in it (its ``file_system`` strategy counts a
        reference for each message in flight, dropped as it is unpickled;
        a descriptor waits in the sender until fetched) is let go of only so.
        """
        try:
            if self.refs is None:
                ForkingPickler.loads(self.data)
            else:
                arena_discard(self.data, self.refs)
        except Exception:  # noqa: BLE001 - nothing to report: nobody reads it
            pass

    def open(self) -> Any:
        """The payload (in the parent); a failure to unpickle it becomes the task's error (a :class:`ReceiveError`)."""
        try:
            return arena_loads(self.data, self.refs) if self.refs is not None else ForkingPickler.loads(self.data)
        except Exception as exc:  # noqa: BLE001 - raised to the consumer for this task
            return ReceiveError(exc, self.pid)


class WorkerExitStandIn(BaseException):
    """Stands in the parent for the exception that ended a worker thread in a child process.

    Used when that exception cannot travel (it does not pickle there, or not
    unpickle here): ``repr()`` gives the original's, so the "exited
    unexpectedly" error still names it.
    """

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __repr__(self) -> str:
        return self.text


class Death:
    """The exception that ended a worker thread, as it travels to the parent (see :class:`Parcel`).

    Its message must arrive whatever the exception holds: a lost one would
    leave the consumer waiting for that worker's tasks for ever.
    """

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        text = _safe_repr(self.exc)
        try:
            return _undeath, (_dumps(self.exc), text)
        except Exception:  # noqa: BLE001 - unpicklable: its repr travels instead
            return WorkerExitStandIn, (text,)


def _safe_repr(obj: Any) -> str:
    try:
        return repr(obj)
    except Exception:  # noqa: BLE001
        return f"<{type(obj).__name__} object>"


def _undeath(data: bytes, text: str) -> BaseException:
    """Unpickle a :class:`Death` (in the parent); one that fails gives its stand-in."""
    try:
        exc = ForkingPickler.loads(data)
    except Exception:  # noqa: BLE001 - e.g. a required __init__ argument
        return WorkerExitStandIn(text)
    return exc if isinstance(exc, BaseException) else WorkerExitStandIn(text)


#: DataLoader's error when a result cannot be received for want of file
#: descriptors (torch.utils.data.dataloader), word for word.
TOO_MANY_OPEN_FILES = (
    "Too many open files. Communication with the workers is no longer possible. Please increase the "
    "limit using `ulimit -n` in the shell or change the sharing strategy by calling "
    "`torch.multiprocessing.set_sharing_strategy('file_system')` at the beginning of your code"
)

#: Files that must still open for a failure not to be blamed on the descriptor limit (DataLoader's margin).
_FD_MARGIN = 10


def out_of_fds() -> bool:
    """Whether this process is within :data:`_FD_MARGIN` of its open-files limit, as DataLoader tests it."""
    import tempfile

    try:
        with contextlib.ExitStack() as stack:
            for _ in range(_FD_MARGIN):
                stack.enter_context(tempfile.TemporaryFile())
    except OSError as e:
        return e.errno == errno.EMFILE
    return False


class ReceiveError(ExceptionWrapper):
    """A result the loader's process could not unpickle: its task raises the unpickling error itself.

    DataLoader re-raises that exception, unchanged, from ``next()``; so does
    this (an :class:`ExceptionWrapper`, so the consumer calls :meth:`reraise`),
    with a note saying which worker process sent the result.
    """

    def __init__(self, exc: Exception, pid: int) -> None:
        where = f"in the loader's process, receiving a result from DataLoader worker process (pid {pid})"
        super().__init__((type(exc), exc, exc.__traceback__), where=where)
        if hasattr(exc, "add_note"):  # Python 3.11+
            exc.add_note(f"Raised {where}; the worker process is still running.")
        self.exc: BaseException | None = exc
        # Checked now, where it failed: received tensors each hold a descriptor.
        self.out_of_fds = out_of_fds()

    def reraise(self) -> None:
        if self.out_of_fds:
            # DataLoader's advice in place of the unpickler's ("received 0 items of ancdata").
            self.exc = None
            raise RuntimeError(TOO_MANY_OPEN_FILES) from None
        exc, self.exc = self.exc, None  # raised once; no cycle through this wrapper
        if exc is None:
            super().reraise()
        try:
            raise exc
        finally:
            exc = None


class ParcelQueue:
    """The child's result queue as its worker threads see it: data payloads travel as :class:`Parcel`,
    the exceptions that end worker threads as :class:`Death`."""

    __slots__ = ("_queue", "_order", "_pid")

    def __init__(self, results: Any) -> None:
        self._queue = results
        self._pid = os.getpid()  # made in the child that sends: asked once, not per result
        # Results are sealed (pickled) and queued in one order: the first
        # result to name an arena block carries its storage, and a later one
        # naming it by id alone must not overtake it (nor one that failed to
        # pickle and gave the block's first trip back). Sealed and queued
        # under one lock, they leave in the order they were sealed.
        self._order = threading.Lock()

    def put(self, msg: tuple[int, int, int, int, Any]) -> None:
        kind, gen, idx, worker_id, payload = msg
        if kind == Kind.DIED:
            payload = Death(payload)
        elif kind == Kind.DATA:
            with self._order:
                parcel = Parcel.seal(payload, worker_id, self._pid)
                self._queue.put((_DATA, gen, idx, worker_id, (parcel.data, parcel.pid, parcel.refs)))
            return
        self._queue.put((int(kind), gen, idx, worker_id, payload))
