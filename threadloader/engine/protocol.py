"""The engine <-> pool protocol: what the iterator sends a pool, what a pool sends back.

The iterator (:mod:`.iterator`) drives any object that has the shape of
:class:`Pool`: it submits :class:`Job` s to workers by id and reads
:class:`Message` s from ``pool.results``. The engine ships one pool (worker
threads of this process, :class:`threadloader.engine.thread_pool.ThreadPool`); the
loader may hand the iterator a factory of another (worker processes), which
the engine never imports.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple, Protocol, Sequence, runtime_checkable

__all__ = ["Adapts", "ITER_TASK", "PARK_TASK", "SYNC_TASK", "STOPPED_MESSAGE", "Job", "Kind", "Message", "Mode", "ModeReport",
           "Pool", "PoolFactory", "ProcessDeath", "ResultQueue", "ShortBatch", "Stated", "WorkerConfig"]

#: Why a stopped pool takes no more work (the consumer's RuntimeError).
STOPPED_MESSAGE = "ThreadDataLoader's workers have been shut down; this iterator cannot be used again"

#: The task number of a job that asks a worker to answer ``Kind.SYNCED`` once
#: it has run every job queued before it (DataLoader's ``_ResumeIteration``).
SYNC_TASK = -1

#: The task number of a job that asks a worker of an IterableDataset with its
#: own state to begin the job's epoch (``__iter__`` on its copy) and answer
#: ``Kind.SYNCED`` with its copy's state then, as StatefulDataLoader's workers
#: acknowledge a new epoch with theirs.
ITER_TASK = -2

#: The task number of a job that asks a map-style worker thread, once it has
#: run every job queued before it, to answer ``Kind.PARKED`` with a
#: :class:`threadloader.worker.handoff.WorkerHandoff` (what it would take to go
#: on elsewhere) and then wait for its next job.
PARK_TASK = -3


class Kind(enum.IntEnum):
    """What a result message says."""

    #: A task's result (its batch, or the ExceptionWrapper of its failure).
    DATA = 0
    #: An IterableDataset worker's replica is exhausted.
    STOPPED = 1
    #: A worker is gone for good: its payload is the BaseException that ended
    #: its thread, or the :class:`ProcessDeath` of its worker process.
    DIED = 2
    #: A worker process crashed: the payload is the message of the RuntimeError the consumer raises.
    CRASHED = 3
    #: A worker's answer to a ``SYNC_TASK`` or ``ITER_TASK`` job.
    SYNCED = 4
    #: A worker's answer to a ``PARK_TASK`` job: its handoff.
    PARKED = 5


class Mode(enum.Enum):
    """Where a loader's workers run."""

    THREADS = "threads"
    PROCESSES = "processes"
    #: In the consumer's thread: each worker in a context of its own (:mod:`.inline_pool`).
    INLINE = "inline"


@dataclass
class ModeReport:
    """Which mode a pool's workers run in, and why, in words a user reads (``stats()``).

    The loader makes one per loader; the pool it picks updates it when it
    changes mode.
    """

    mode: Mode
    reason: str
    #: The choice is final for the loader: its later iterators start in this mode.
    settled: bool = False

    def line(self) -> str:
        """One line: the mode, then why."""
        return f"{self.mode.value} ({self.reason})"


class Job(NamedTuple):
    """One task for one worker."""

    task: int  # its number in the epoch (SYNC_TASK: answer Kind.SYNCED)
    generation: int  # the pool's generation when it was submitted
    index: Any  # what the sampler gave (a batch of indices, one index, None)


class Message(NamedTuple):
    """One message on a pool's result queue."""

    kind: Kind
    generation: int
    task: int  # -1 when it is about no task
    worker_id: int  # -1 when it is about no worker
    payload: Any


class ProcessDeath(NamedTuple):
    """A ``Kind.DIED`` payload: a worker process died, and with it all its worker threads."""

    pid: int
    worker_ids: tuple[int, ...]
    detail: str = ""  # how it died, in torch's words: the error's cause

    def error(self, *others: ProcessDeath) -> RuntimeError:
        """DataLoader's "exited unexpectedly" error for this death (and ``others``), raised once for them all.

        Chained as DataLoader chains it, from this death's detail (its SIGCHLD handler's error).
        """
        pids = ", ".join(str(death.pid) for death in (self, *others))
        error = RuntimeError(f"DataLoader worker (pid(s) {pids}) exited unexpectedly")
        if self.detail:
            error.__cause__ = RuntimeError(self.detail)
        return error


class Stated(NamedTuple):
    """A result (or a ``Kind.STOPPED`` message's payload) with the worker's dataset copy's state after its task."""

    payload: Any
    state: Any
    #: An IterableDataset's first result of an epoch: the copy's state right after ``__iter__``.
    iter_state: Any = None
    #: The worker resumed from its checkpointed state: none of its batches is to be dropped.
    went_on: bool = False


class ShortBatch(NamedTuple):
    """An IterableDataset batch with fewer samples than asked for (its replica ended), as posted."""

    batch: Any
    items: int


@dataclass
class WorkerConfig:
    """What every worker thread needs; read-only once threads start."""

    dataset: Any
    kind: int
    auto_collation: bool
    collate_fn: Callable
    drop_last: bool
    base_seed: int
    init_fn: Callable | None
    num_workers: int
    pin: bool
    pin_device: str | None
    device_index: int | None
    items_per_task: int = 1  # samples a task fetches (the batch size when batching)
    #: The worker is its child process's only one (worker_processes == num_workers).
    owns_process: bool = False
    #: An iterable DataPipe's shared seed for the pool's first epoch (DataLoader's ``_shared_seed``), else None.
    shared_seed: int | None = None
    #: The dataset keeps its own state (``state_dict``): every result carries
    #: the worker copy's state after its task (:class:`Stated`).
    track_state: bool = False
    #: By worker id, the state each worker's copy loads before it serves
    #: (a resume), after ``worker_init_fn`` as in StatefulDataLoader; None: none.
    worker_states: list[Any] | None = None
    #: An IterableDataset's resume, by worker id: the copy's state right after
    #: the interrupted epoch's ``__iter__``, and after its last received batch
    #: (see :class:`threadloader.resume.ResumePlan`); None: not recorded.
    iter_states: list[Any] | None = None
    resume_states: list[Any] | None = None
    #: By worker id, the :class:`threadloader.worker.handoff.WorkerHandoff`
    #: a worker goes on from (moved from a thread of the loader's process):
    #: its copies, generators and set-up outcome, with no ``worker_init_fn``
    #: run again. None: the workers start afresh.
    handoffs: Mapping[int, Any] | None = None

    def handoff(self, worker_id: int) -> Any:
        """Worker ``worker_id``'s handoff (see ``handoffs``), or None: it starts afresh."""
        return self.handoffs.get(worker_id) if self.handoffs is not None else None


class ResultQueue(Protocol):
    """Where a pool's messages wait for the consumer (``queue.SimpleQueue.get``'s arguments and ``queue.Empty``)."""

    def get(self, block: bool = True, timeout: float | None = None) -> Message: ...


class Pool(Protocol):
    """What the iterator needs of a pool of workers.

    ``in_process``: the workers run in this process, so their batches are built
    in this process's buffer pools. ``replicas``: each worker's copy of the
    dataset by worker id, where this process holds them (else None).
    """

    @property
    def results(self) -> ResultQueue: ...

    @property
    def counters(self) -> Sequence[Any]: ...

    @property
    def in_process(self) -> bool: ...

    @property
    def generation(self) -> int: ...

    @property
    def replicas(self) -> Mapping[int, Any] | None: ...

    @property
    def workers(self) -> list[Any]: ...

    def submit(self, worker_id: int, job: Job) -> None:
        """Queue ``job`` for worker ``worker_id``.

        Raises:
            RuntimeError: the pool was stopped.
        """

    def new_epoch(self, generation: int | None = None, seed: int | None = None) -> None:
        """Start a new generation: results of older ones are stale from now on."""

    def stop(self) -> None:
        """Stop the workers (idempotent)."""


@runtime_checkable
class Adapts(Protocol):
    """A pool that may act on GIL-bound workers (the adaptive mode's)."""

    def on_gil_bound(self, verdict: Any) -> bool:
        """The workers look GIL-bound (a :class:`threadloader.stats.gil.GilBound`).

        Returns:
            True: the pool acts on it (it moves its workers into processes),
            so no warning is given.
        """

    def on_long_wait(self, look: Callable[[], None]) -> None:
        """Have the consumer call ``look`` each time it has waited a while for a message with nothing arriving.

        The GIL check runs when results arrive; tasks that take seconds each
        would put the first check seconds into the epoch. ``look`` runs it
        between results.
        """


#: Makes the pool an iterator runs its workers in.
PoolFactory = Callable[[WorkerConfig], Pool]
