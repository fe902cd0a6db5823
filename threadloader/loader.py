"""The public loader: DataLoader's constructor, iteration on threads."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from torch.utils.data import DataLoader, Dataset, Sampler

from . import worker as _worker  # noqa: F401 - installs thread-aware worker info
from ._engine import ThreadedLoaderIter
from .stats import LoaderStats

__all__ = ["ThreadDataLoader"]


class ThreadDataLoader(DataLoader):
    """``torch.utils.data.DataLoader`` with worker *threads* instead of processes.

    The signature, argument validation, samplers, ``len()``, errors and
    warnings are DataLoader's own (this is a subclass; torch checks the
    arguments). What changes is how batches are produced when
    ``num_workers > 0``: ``num_workers`` threads share the dataset object (no
    copy, no pickling), fetch samples in parallel, collate in the worker, and
    the batches come out in sampler order (or as ready with ``in_order=False``).
    ``num_workers=0`` loads in the calling thread, exactly as DataLoader does.

    ``multiprocessing_context`` is validated as DataLoader validates it and
    otherwise ignored: no process is started.

    Args:
        The same as :class:`torch.utils.data.DataLoader`.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler | Iterable | None = None,
        batch_sampler: Sampler[list] | Iterable[list] | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[list], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context=None,
        generator=None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
    ) -> None:
        super().__init__(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            drop_last=drop_last,
            timeout=timeout,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            generator=generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
        )

    def _get_iterator(self):
        if self.num_workers == 0:
            return super()._get_iterator()
        self.check_worker_number_rationality()
        it = ThreadedLoaderIter(self)
        # Keep the counters, not the iterator: holding the iterator would keep
        # its threads alive after the user dropped it.
        self._last_stats = it.stats
        return it

    def stats(self) -> LoaderStats | None:
        """Statistics of the most recent threaded iterator (None before one).

        Returns:
            A :class:`threadloader.stats.LoaderStats`; ``snapshot()`` gives a
            dict of batches, items, consumer wait, fetch/collate/pin time and
            worker utilisation.
        """
        return getattr(self, "_last_stats", None)
