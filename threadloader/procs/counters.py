"""The workers' counters of a ``worker_processes`` pool, as rows of one shared array.

The parent makes the array in shared memory; a child's worker threads write
their rows as the thread engine's :class:`threadloader.stats.WorkerCounters`
are written, and :class:`threadloader.stats.LoaderStats` reads them in the
parent.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..stats.counters import WorkerCounters

__all__ = ["COLUMNS", "CPU", "ArrayCounters"]

#: Columns of the shared counters array (one row per worker). ``CPU``: the
#: CPU time of the worker's process, written by that process's dispatcher on
#: the row of its first worker (the others keep NaN).
_FETCH, _COLLATE, _PIN, _EPOCH, _EPOCH_ITEMS, _TASKS, _BUSY, _FETCH_SINCE, CPU = range(9)
COLUMNS = CPU + 1


class ArrayCounters:
    """One worker's :class:`threadloader.stats.WorkerCounters`, as a row of a shared array.

    The child's worker thread writes every column but ``pin_s``, which the
    parent's receiver writes, and ``process_cpu_s``, which the child's
    dispatcher writes; readers get approximate values, as with threads.

    Args:
        array: the shared array, one row per worker.
        worker_id: this worker's row.
        process: the index of the child process the worker runs in (stats'
            GIL check looks at each process's threads together).
    """

    __slots__ = ("_row", "process")

    #: The worker runs in a child: the parent's CPU time does not show it (stats' GIL check).
    in_this_process = False

    def __init__(self, array: np.ndarray, worker_id: int, process: int = 0) -> None:
        self._row = array[worker_id]
        self.process = process

    def detach(self) -> None:
        """Keep the row in private memory from now on (the children are gone)."""
        self._row = self._row.copy()

    def _get(col: int, cast: type = float) -> property:  # type: ignore[misc]  # noqa: N805
        def get(self: ArrayCounters) -> Any:
            return cast(self._row[col])

        def set_(self: ArrayCounters, value: Any) -> None:
            self._row[col] = value

        return property(get, set_)

    fetch_s = _get(_FETCH)
    collate_s = _get(_COLLATE)
    pin_s = _get(_PIN)
    epoch = _get(_EPOCH, int)
    epoch_items = _get(_EPOCH_ITEMS, int)
    tasks = _get(_TASKS, int)
    busy = _get(_BUSY, bool)
    #: ``time.perf_counter()`` at the start of the fetch in progress (0.0: none); the
    #: monotonic clock is the machine's, so the parent reads a child's stamp as its own.
    fetch_since = _get(_FETCH_SINCE)
    #: CPU seconds of the worker's whole process (all its threads), as last sampled by its dispatcher
    #: (on the process's first worker's row only: read it there).
    process_cpu_s = _get(CPU)
    del _get
    fetched = WorkerCounters.fetched
    fetch_until = WorkerCounters.fetch_until
