"""Progress: which of an epoch's batches the consumer received, and where it is kept.

The checkpoint record of an epoch (:func:`progress_record`) and the box a
dropped iterator leaves it in, so that ``state_dict()`` after ``break``
still names the batches that remain.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from .states import CheckpointUnavailable, check_states

if TYPE_CHECKING:
    from .epoch import EpochStart

__all__ = ["ProgressBox", "RecordsProgressOnDrop", "progress_record"]

class ProgressBox:
    """Where an iterator leaves its epoch record when it is dropped.

    The loader holds the box, not the iterator (holding the iterator would keep
    its worker threads alive after ``break``), so ``state_dict()`` taken after
    the iterator is gone still names the batches that remain.
    """

    __slots__ = ("record", "error")

    def __init__(self) -> None:
        self.record: dict[str, Any] | None = None
        self.error: CheckpointUnavailable | None = None  # raised by the loader's state_dict()


class RecordsProgressOnDrop:
    """Mixin for iterators with ``progress()``: on drop, the record goes to ``progress_box``."""

    progress_box: ProgressBox | None = None

    def _progress_on_drop(self) -> dict[str, Any] | None:
        """The record of an iterator that will never be asked for another batch."""
        return self.progress()  # type: ignore[attr-defined]

    def checkpoint_taken(self) -> None:
        """Called by the loader once a state dict was made from ``progress()``."""

    # Bound now: at interpreter exit a module's globals (``sys``) may already
    # be None when the last iterators are collected.
    def __del__(self, _is_finalizing: Any = sys.is_finalizing) -> None:
        box = self.progress_box
        if box is None or _is_finalizing():  # no checkpoint is taken after exit; torch may be torn down
            return
        try:
            box.record = self._progress_on_drop()
        except CheckpointUnavailable as e:
            box.record, box.error = None, e
        except Exception:  # noqa: BLE001 - a half-built iterator, or interpreter exit
            box.record = None


def progress_record(start: EpochStart, prefix: int, extra: list[int], num_yielded: int,
                    worker_received: list[int] | None = None, fresh: bool = False,
                    worker_states: list[Any] | None = None, iter_states: list[Any] | None = None,
                    resume_states: list[Any] | None = None) -> dict[str, Any]:
    """An epoch's checkpoint record (``fresh``: taken before the epoch made any draw; see ResumePlan).

    Args:
        worker_states: a map-style dataset with its own state: each worker's
            copy's state after its last received batch (one entry, the
            loader's dataset, without workers).
        iter_states, resume_states: an IterableDataset with its own state
            (see :class:`ResumePlan`).
    """
    start.check()
    record = {
        "start": start.to_record(),
        "consumed_prefix": int(prefix),
        "consumed_extra": sorted(int(i) for i in extra),
        "num_yielded": int(num_yielded),
    }
    if worker_received is not None:
        record["worker_received"] = [int(n) for n in worker_received]
    if fresh:
        record["fresh"] = True
    for key, values in (("worker_states", worker_states), ("iter_states", iter_states),
                        ("resume_states", resume_states)):
        if values is not None:
            check_states(values)
            record[key] = list(values)
    return record
