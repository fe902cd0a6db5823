"""The public loader: DataLoader's constructor, iteration on threads."""

from __future__ import annotations

import contextlib
import os
import weakref
from typing import Any, Callable, Iterable, TypeVar, cast

from torch.utils.data import DataLoader, Dataset, Sampler

from . import adaptive as _adaptive
from . import procs as _procs
from . import resume as _state
from ._platform import torch_compat as _torch_compat
from .engine import ResumableSingleIter, ThreadedLoaderIter, start_thread_pool
from .engine.protocol import Mode, ModeReport, PoolFactory, WorkerConfig
from .images import buffers as _pool  # noqa: F401 - registers the batch buffers' reservations (engine hooks)
from .stats.counters import LoaderStats
from .worker import info as _worker  # noqa: F401 - installs thread-aware worker info

__all__ = ["ThreadDataLoader"]

_T_co = TypeVar("_T_co", covariant=True)


class ThreadDataLoader(DataLoader[_T_co]):
    """``torch.utils.data.DataLoader`` with worker *threads* instead of processes.

    The signature, argument validation, samplers, ``len()``, errors and
    warnings are DataLoader's own (this is a subclass; torch checks the
    arguments). What changes is how batches are produced when
    ``num_workers > 0``: ``num_workers`` threads each take a shallow copy of
    the dataset (``copy.copy``: what it holds is shared, nothing is pickled),
    each fetches and collates whole batches (task i to worker i mod
    ``num_workers``, as DataLoader's round robin), and the batches come out in
    sampler order (or as ready with ``in_order=False``).
    ``num_workers=0`` loads in the calling thread, exactly as DataLoader does.

    ``worker_processes`` (keyword-only) says where the workers run. By
    default (None) the loader decides: its workers start as threads, and when
    they hold the GIL (busy threads taking turns on one core while cores
    stand idle) and their tasks are big enough, they move into child
    processes, one worker per process, within the first seconds of the
    epoch, each with its dataset copy and random state as they are.
    ``stats().mode`` says which mode runs and why. ``worker_processes=0``
    keeps threads; ``worker_processes=P`` spreads the ``num_workers`` threads
    over P child processes from the start (worker ``w`` in process ``w % P``).
    In processes, batches are built in shared memory. The contract is the
    same in every mode. ``multiprocessing_context`` picks the processes'
    start method; with threads only it is validated as DataLoader validates
    it and otherwise ignored.

    Every argument is DataLoader's, with DataLoader's meaning, plus one.

    Args:
        worker_processes: None (the loader decides), 0 (all workers are
            threads of this process) or 1 .. ``num_workers`` worker processes.

    Raises:
        ValueError: DataLoader's errors, and a ``worker_processes`` that is
            not None or an int in 0 .. ``num_workers`` (or > 0 with no workers).
    """

    def __init__(
        self,
        dataset: Dataset[_T_co],
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
        worker_processes: int | None = None,
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
        _procs.check_worker_processes(worker_processes, self.num_workers)
        self.worker_processes = worker_processes
        # Where this loader's workers run and why (stats().mode); an adaptive
        # pool updates it, and later iterators start where it ended.
        self._mode_report: ModeReport | None = None
        self._resume_plan: _state.ResumePlan | None = None
        self._pending_plan: _state.ResumePlan | None = None
        # The latest iterator _get_iterator built, held weakly: the one
        # state_dict() asks for its progress (a subclass may wrap it, in an
        # itertools.islice say, and return the wrapper from iter()).
        self._live_iterator: weakref.ref | None = None
        # Where the latest iterator leaves its position when it is dropped
        # (``break`` out of a loop without persistent workers).
        self._progress_box: _state.ProgressBox | None = None
        # The counters of the last threaded iterator, not the iterator: holding
        # it would keep its threads alive after the user dropped it.
        self._last_stats: LoaderStats | None = None
        # Set by the Accelerate integration: state_dict() returns a state whose
        # load raises, instead of raising itself (see state_dict).
        self._defer_checkpoint_errors = False

    def __iter__(self) -> _torch_compat.BaseDataLoaderIter:
        stale = self._iterator
        if stale is not None and getattr(stale, "owner_pid", None) not in (None, os.getpid()):
            # persistent_workers in a forked process: the workers are the
            # parent's, whose next epoch no one here would serve. Workers of
            # its own instead (its copy stops nothing of the parent's).
            self._iterator = None
        plan, self._resume_plan = self._resume_plan, None
        if plan is None:
            it = super().__iter__()
        else:
            self._pending_plan = plan
            try:
                with contextlib.nullcontext() if plan.fresh_epoch else _state.isolated_rng(self):
                    it = super().__iter__()
            finally:
                self._pending_plan = None
        return it

    def __getstate__(self) -> dict[str, Any]:
        # Picklable like DataLoader: the weak reference to the live iterator
        # is process-local (a copy has no iterator of its own yet).
        state = self.__dict__.copy()
        state["_live_iterator"] = None
        state["_progress_box"] = None
        return state

    def _get_iterator(self) -> ResumableSingleIter | ThreadedLoaderIter:
        plan = self._pending_plan
        it: ResumableSingleIter | ThreadedLoaderIter
        if self.num_workers == 0:
            it = ResumableSingleIter(self, plan)
        else:
            # Called as DataLoader's worker iterator calls it, so its warning
            # is attributed to the same place (torch.utils.data.dataloader).
            _torch_compat.check_worker_number_rationality(self)
            _procs.check_worker_processes(self.worker_processes, self.num_workers)  # it is a plain attribute
            it = ThreadedLoaderIter(self, plan, self._pool_factory())
            it.stats.mode_report = self._mode_report
            if self._last_stats is not None and self._last_stats.gil_warned:
                it.stats.gil_warned = True  # the GIL warning is given once per loader, not per epoch
            self._last_stats = it.stats
        self._progress_box = it.progress_box = _state.ProgressBox()
        self._live_iterator = weakref.ref(it)
        return it

    def _pool_factory(self) -> PoolFactory:
        """How the next iterator runs its workers: threads of this process, child processes, or the adaptive pool.

        Also sets the loader's mode report (``stats().mode``).
        """
        # An int here: DataLoader sets prefetch_factor (2 by default) when there are workers.
        prefetch = cast(int, self.prefetch_factor)
        report = self._mode_report
        if self.worker_processes:
            self._mode_report = ModeReport(Mode.PROCESSES, f"worker_processes={self.worker_processes}")
            return _procs.process_pool_factory(self.worker_processes, self.multiprocessing_context, prefetch)
        if self.worker_processes == 0:
            self._mode_report = ModeReport(Mode.THREADS, "worker_processes=0")
            return start_thread_pool
        processes = _procs.process_pool_factory(self.num_workers, self.multiprocessing_context, prefetch)
        if report is not None and report.settled:  # an earlier iterator moved, or could not: later ones start there
            return processes if report.mode is Mode.PROCESSES else start_thread_pool
        why = _adaptive.ineligible(self)
        if why is not None:
            self._mode_report = ModeReport(Mode.THREADS, f"adaptive: stays on threads, {why}")
            return start_thread_pool
        inline_blocked = _adaptive.inline_ineligible(self)
        self._mode_report = report = ModeReport(Mode.THREADS, (
            "adaptive: the workers move into processes if they hold the GIL"
            if inline_blocked else "adaptive: the workers move into processes if they hold the GIL, "
            "or into the consumer's thread if their tasks cost less than the hand-offs"))

        def make(cfg: WorkerConfig) -> _adaptive.AdaptivePool:
            return _adaptive.AdaptivePool(cfg, report, processes, inline_blocked)

        return make

    def stats(self) -> LoaderStats | None:
        """Statistics of the most recent threaded iterator (None before one).

        Returns:
            A :class:`threadloader.stats.LoaderStats`; ``snapshot()`` gives a
            dict of batches, items, consumer wait, fetch/collate/pin time and
            worker utilisation.
        """
        return self._last_stats

    # --- checkpointing --------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The loader's position, for resuming after preemption.

        Call it between batches, or after leaving the loop (``break``): the
        position of a dropped iterator is kept until the next ``iter()``. It
        records the current epoch's random state at its start and which
        batches the consumer has received (batches that
        were prefetched but not yet received are *not* counted: after resume
        they are produced again, so none is lost). The dict holds plain values
        and CPU tensors: ``torch.save`` writes it.

        With ``in_order=False`` the received batches are recorded one by one,
        so resume skips exactly those; what cannot be promised is the *order*
        in which the remaining ones arrive (it never could).

        Returns:
            A dict for :meth:`load_state_dict` of a loader built with the same
            arguments.

        Raises:
            threadloader.state.CheckpointUnavailable: the ``state_dict()`` of
                the sampler or IterableDataset raised when this epoch started.
        """
        try:
            return self._state_dict()
        except _state.CheckpointUnavailable as e:
            if not self._defer_checkpoint_errors:
                raise
            # Prepared through threadloader.integrations.accelerate: Accelerate
            # reads the state before every batch. The error waits for a load.
            return _state.unavailable_state(e)

    def _state_dict(self) -> dict[str, Any]:
        if self._resume_plan is not None:
            # Loaded, not iterated yet: still the loaded position (preempted
            # again before the first batch), not an older iterator's.
            return _state.make_state(self, self._resume_plan.record())
        it = self._live_iterator() if self._live_iterator is not None else None
        if it is not None and hasattr(it, "progress"):
            try:
                progress = it.progress()
                persistent_base_seed = worker_states = None
                if progress is None and self.persistent_workers and self.num_workers > 0:
                    persistent_base_seed = int(_torch_compat.base_seed_of(it))
                    worker_states = it.next_epoch_worker_states()  # its workers' copies go on
                return _state.make_state(self, progress, persistent_base_seed, worker_states)
            finally:
                it.checkpoint_taken()  # random draws made ahead for the checkpoint wait for the next next()
        if it is None and self._progress_box is not None:
            if self._progress_box.error is not None:
                raise self._progress_box.error
            return _state.make_state(self, self._progress_box.record)  # the iterator was dropped mid-epoch
        return _state.make_state(self, None)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next ``iter()`` yields the rest of that epoch.

        Later epochs continue as in the uninterrupted run. When the loader has
        no ``generator``, shuffling draws from torch's global RNG, so this also
        restores the global RNG to its state at checkpoint time.

        Raises:
            ValueError: ``state_dict`` is not a ThreadDataLoader state (or a
                malformed one), or records a position inside an epoch of a
                loader built differently (batch size, length, ...).
            threadloader.state.CheckpointUnavailable: the state records that
                its epoch could not be checkpointed (see :meth:`state_dict`).
        """
        plan = _state.plan_from_state(self, state_dict)
        if self._iterator is not None:  # a persistent iterator of an older position
            _torch_compat.shutdown_workers(self._iterator)
            self._iterator = None
        self._progress_box = None
        self._live_iterator = None  # an older iterator's position is no longer the loader's
        self._resume_plan = plan
