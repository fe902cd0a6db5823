"""When the adaptive mode may move a loader's workers into processes, and when a move pays."""

from __future__ import annotations

import multiprocessing
import os
from typing import Any

from .._platform.interpreter import gil_enabled
from .._platform.torch_compat import DatasetKind
from ..stats.gil import GilBound
from ..worker.datapipes import is_datapipe

__all__ = ["MIN_TASK_CPU_S", "MOVE_AFTER_ENV", "forced_move_after", "ineligible", "worth_moving"]

#: The CPU seconds a task must cost before its worker moves: a process adds
#: a fixed cost per task (its job and result cross a pipe, its batch is
#: mapped), which a task much cheaper than this would not earn back.
MIN_TASK_CPU_S = 1e-3

#: An environment variable: a number N moves the adaptive mode's workers into
#: processes once N results have reached the consumer, whatever their GIL
#: use, the GIL off included (to test a pipeline in both modes, and for this
#: project's tests).
MOVE_AFTER_ENV = "THREADLOADER_MOVE_AFTER"


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
    if not gil_enabled() and forced_move_after() is None:
        return "this Python runs without a GIL: threads run in parallel"
    if multiprocessing.current_process().daemon:
        return "this process is a daemon (a worker process itself), which cannot start processes"
    return None


def worth_moving(verdict: GilBound) -> bool:
    """Whether GIL-bound workers load faster in processes: their tasks cost enough CPU each."""
    return verdict.task_cpu_s >= MIN_TASK_CPU_S


def forced_move_after() -> int | None:
    """The results after which the workers move whatever their GIL use (:data:`MOVE_AFTER_ENV`), or None.

    Raises:
        ValueError: the variable is set to something other than a non-negative integer.
    """
    value = os.environ.get(MOVE_AFTER_ENV, "").strip()
    if not value:
        return None
    if not value.isdigit():
        raise ValueError(f"{MOVE_AFTER_ENV} must be a non-negative integer, got {value!r}")
    return int(value)
