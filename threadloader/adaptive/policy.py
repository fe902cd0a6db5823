"""When the adaptive mode may move a loader's workers (into processes, or into the consumer's thread), and when a move pays."""

from __future__ import annotations

import multiprocessing
import os
from typing import Any

from .._platform.interpreter import gil_enabled
from .._platform.torch_compat import DatasetKind
from ..stats.gil import GilBound
from ..worker.datapipes import is_datapipe

__all__ = ["BACK_AFTER_LOOKS", "INLINE_AFTER_ENV", "INLINE_CHECK_EVERY", "INLINE_MARGIN", "LOOK_EVERY_S", "MAX_INLINE_TASK_S", "MIN_TASK_CPU_S",
           "MOVE_AFTER_ENV", "HandoffWatch", "InlineWatch", "forced_inline_after", "forced_move_after", "ineligible",
           "inline_ineligible", "worth_inlining", "worth_moving"]

#: The CPU seconds a task must cost before its worker moves: a process adds
#: a fixed cost per task (its job and result cross a pipe, its batch is
#: mapped), which a task much cheaper than this would not earn back.
MIN_TASK_CPU_S = 1e-3

#: An environment variable: a number N moves the adaptive mode's workers into
#: processes once N results have reached the consumer, whatever their GIL
#: use, the GIL off included (to test a pipeline in both modes, and for this
#: project's tests).
MOVE_AFTER_ENV = "THREADLOADER_MOVE_AFTER"

#: The same, to move the workers into the consumer's thread (where the loader may: :func:`inline_ineligible`).
INLINE_AFTER_ENV = "THREADLOADER_INLINE_AFTER"

#: The workers move into the consumer's thread when a task costs at most
#: this fraction of the consumer's time per result: the rest is the hand-offs.
INLINE_MARGIN = 2.0

#: ... and at most this long (seconds): a task run in the consumer's thread
#: delays the training loop by all of its time, and only tasks cheaper than a
#: few hand-offs are worth it.
MAX_INLINE_TASK_S = 100e-6

#: While the consumer waits with no result arriving, how often (seconds) the
#: GIL check is asked to look (it runs once its window is due): tasks that take
#: seconds must not put the move seconds into the epoch.
LOOK_EVERY_S = 0.1

#: Results between two looks at the tasks' cost against the consumer's waits.
INLINE_CHECK_EVERY = 128

#: Looks in a row that must find the consumer's thread slower than threads before the workers go
#: back: one look spans a millisecond or so, which a busy machine's scheduler can stretch.
BACK_AFTER_LOOKS = 3


def ineligible(loader: Any) -> str | None:
    """Why ``loader``'s workers must stay threads of this process (a reason a user reads), or None: they may move.

    A worker moves between two of its tasks with its dataset copy and
    generators as they are. A map-style worker holds nothing else; an
    IterableDataset worker holds a live iterator, which cannot move.
    """
    if loader.num_workers < 2:
        return "one worker: a GIL shared with the training loop only"
    if loader._dataset_kind == DatasetKind.Iterable:
        return "an IterableDataset: its workers' iterators cannot move into processes"
    if is_datapipe(loader.dataset):
        return "a DataPipe graph: its workers' iterators cannot move into processes"
    if not gil_enabled() and forced_move_after() is None and forced_inline_after() is None:
        return "this Python runs without a GIL: threads run in parallel"
    if multiprocessing.current_process().daemon:
        return "this process is a daemon (a worker process itself), which cannot start processes"
    return None


def inline_ineligible(loader: Any) -> str | None:
    """Why ``loader``'s workers must not run in the consumer's thread (a reason a user reads), or None: they may."""
    if loader.timeout > 0:
        return "a timeout: the consumer cannot time a task it runs itself"
    return None


def worth_inlining(task_s: float, wait_s: float) -> bool:
    """Whether tasks of ``task_s`` seconds each, whose results cost the consumer ``wait_s`` each, run faster in its thread."""
    return task_s <= MAX_INLINE_TASK_S and task_s * INLINE_MARGIN <= wait_s


class _Window:
    """The consumer's mean time per result over each :data:`INLINE_CHECK_EVERY` results."""

    def __init__(self) -> None:
        self._results = 0
        self._spent_s = 0.0

    def add(self, spent_s: float) -> float | None:
        """Count one result that took the consumer ``spent_s``; the window's mean once it is full, else None."""
        self._results += 1
        self._spent_s += spent_s
        if self._results < INLINE_CHECK_EVERY:
            return None
        mean = self._spent_s / self._results
        self._results, self._spent_s = 0, 0.0
        return mean


class HandoffWatch:
    """Worker threads: the consumer's time per result against the workers' time per task.

    Args:
        counters: the worker threads' counters (``tasks``, ``fetch_s``, ``collate_s``, ``pin_s``).
    """

    def __init__(self, counters: Any) -> None:
        self._counters = counters
        self._window = _Window()
        self._seen = self._totals()
        #: At the last look: the workers' seconds per task, and the consumer's per result.
        self.task_s = 0.0
        self.wait_s = 0.0

    def _totals(self) -> tuple[int, float]:
        counters = self._counters
        return (sum(c.tasks for c in counters), sum(c.fetch_s + c.collate_s + c.pin_s for c in counters))

    def add(self, wait_s: float) -> bool:
        """Count one result the consumer waited ``wait_s`` for.

        Returns:
            True: the tasks would run faster in the consumer's thread.
        """
        mean = self._window.add(wait_s)
        if mean is None:
            return False
        tasks, busy_s = self._totals()
        done, spent = tasks - self._seen[0], busy_s - self._seen[1]
        self._seen = (tasks, busy_s)
        if done <= 0:
            return False
        self.task_s, self.wait_s = spent / done, mean
        return worth_inlining(self.task_s, self.wait_s)


class InlineWatch:
    """Workers in the consumer's thread: its time per result against what it was with worker threads.

    Args:
        threads_s: the consumer's time per result with worker threads (``HandoffWatch.wait_s`` when they moved).
    """

    def __init__(self, threads_s: float) -> None:
        self.threads_s = threads_s
        self._window = _Window()
        # The first window holds the move itself (the threads park, the contexts are made).
        self._skip = True
        self._slower = 0  # looks in a row that found the consumer's thread slower
        #: At the last look: the consumer's seconds per result.
        self.inline_s = 0.0

    def add(self, spent_s: float) -> bool:
        """Count one result that took the consumer ``spent_s`` (running its task included).

        Returns:
            True: the tasks cost more now than their results cost with threads
            (:data:`BACK_AFTER_LOOKS` looks in a row): back to threads.
        """
        mean = self._window.add(spent_s)
        if mean is None:
            return False
        if self._skip:
            self._skip = False
            return False
        self.inline_s = mean
        self._slower = self._slower + 1 if mean > self.threads_s else 0
        return self._slower >= BACK_AFTER_LOOKS


def worth_moving(verdict: GilBound) -> bool:
    """Whether GIL-bound workers load faster in processes: their tasks cost enough CPU each."""
    return verdict.task_cpu_s >= MIN_TASK_CPU_S


def forced_move_after() -> int | None:
    """The results after which the workers move whatever their GIL use (:data:`MOVE_AFTER_ENV`), or None.

    Raises:
        ValueError: the variable is set to something other than a non-negative integer.
    """
    return _count_in(MOVE_AFTER_ENV)


def forced_inline_after() -> int | None:
    """The results after which the workers move into the consumer's thread whatever they cost (:data:`INLINE_AFTER_ENV`), or None.

    Raises:
        ValueError: the variable is set to something other than a non-negative integer, or
            :data:`MOVE_AFTER_ENV` is set too.
    """
    after = _count_in(INLINE_AFTER_ENV)
    if after is not None and _count_in(MOVE_AFTER_ENV) is not None:
        raise ValueError(f"{INLINE_AFTER_ENV} and {MOVE_AFTER_ENV} are both set; set one")
    return after


def _count_in(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    if not value.isdigit():
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)
