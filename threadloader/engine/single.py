"""The ``num_workers=0`` iterator: DataLoader's own, with checkpoint and resume."""

from __future__ import annotations

import itertools
from typing import Any

from .._platform.torch_compat import DatasetKind, SingleProcessDataLoaderIter, create_fetcher
from ..resume import (
    DrawsAhead,
    EpochStart,
    RecordsProgressOnDrop,
    ResumePlan,
    dataset_has_state,
    dataset_state_of,
    generators_of,
    progress_record,
    same_state,
    start_state_of,
)

__all__ = ["ResumableSingleIter"]

_MISSING = object()


class ResumableSingleIter(RecordsProgressOnDrop, SingleProcessDataLoaderIter):
    """DataLoader's own ``num_workers=0`` iterator, with checkpoint and resume."""

    def __init__(self, loader: Any, plan: ResumePlan | None = None) -> None:
        # torch's iterator calls iter() on an IterableDataset as it is built,
        # which may change the dataset's state: its epoch-start state is now.
        self._dataset_start = start_state_of(loader.dataset) if plan is None else None
        super().__init__(loader)
        stateful_iterable = self._dataset_kind == DatasetKind.Iterable and dataset_has_state(self._dataset)
        # An IterableDataset's state right after this epoch's __iter__ (see ResumePlan.iter_states).
        self._iter_state = dataset_state_of(self._dataset) if stateful_iterable and plan is None else None
        self._finished = False
        self._loader = loader
        # As DataLoader's own iterator, the sampler is first asked for an
        # index by the first next(), not here: draws from the global RNG in
        # between, or a set_epoch() (Lightning calls it after iter()), must
        # decide the order as they do in DataLoader. So the epoch's random
        # state is recorded then, just before that first draw.
        self._epoch_start: EpochStart | None = None
        # Batches taken from the sampler: the received ones, and one whose
        # fetch raised (DataLoader goes on with the next; it is not yielded).
        self._taken = 0
        self._draws_ahead: DrawsAhead | None = None
        if plan is not None:
            self._base_seed = plan.start.base_seed
            plan.start.apply(loader)
            self._epoch_start = plan.start
            if self._dataset_kind == DatasetKind.Iterable:
                # Made again from the restored dataset (torch made it before).
                self._dataset_fetcher = self._new_fetcher()
            went_on = stateful_iterable and self._goes_on_from_checkpoint(plan)
            self._sampler_iter = iter(self._index_sampler)
            if went_on:
                self._taken = plan.consumed_prefix
            for _ in range(0 if went_on else plan.consumed_prefix):
                try:
                    if self._dataset_kind == DatasetKind.Iterable:
                        self._dataset_fetcher.fetch(self._next_index())  # replicas advance only by reading
                    else:
                        self._next_index()
                except StopIteration:
                    break
                except Exception:  # noqa: BLE001 - a batch whose error was raised before the checkpoint
                    continue
            if self._dataset_kind != DatasetKind.Iterable and plan.worker_states:
                # Where the received batches, not fetched again, left the dataset's own state.
                self._dataset.load_state_dict(plan.worker_states[0])
            if plan.consumed_prefix == 0:
                # The resumed epoch's order comes from the recorded state, which
                # is in place only now (the loader restores the caller's RNG when
                # iter() returns): let the sampler make its first draw here. With
                # batches skipped it has drawn already; a sampler drawing per
                # index must make its next draws after iter(), as it did then.
                first = next(self._sampler_iter, _MISSING)
                if first is not _MISSING:
                    self._sampler_iter = itertools.chain([first], self._sampler_iter)
            self._num_yielded = plan.num_yielded

    def _new_fetcher(self) -> Any:
        return create_fetcher(self._dataset_kind, self._dataset, self._auto_collation, self._collate_fn,
                              self._drop_last)

    def _goes_on_from_checkpoint(self, plan: ResumePlan) -> bool:
        """An IterableDataset with its own state: go on from its checkpointed state where reading again would not do.

        As a worker's copy does (worker_loop._goes_on_from_checkpoint): when
        ``__iter__`` from the epoch-start state did not leave the dataset as
        it left it in the interrupted run, it loads its state after the last
        received batch and a new iterator goes on from there.
        """
        now = dataset_state_of(self._dataset)
        recorded = (plan.iter_states or [None])[0]
        resume = (plan.resume_states or [None])[0]
        self._iter_state = recorded if recorded is not None else now
        if recorded is None or same_state(now, recorded):
            return False
        self._dataset.load_state_dict(recorded if resume is None else resume)  # None: nothing received yet
        self._dataset_fetcher = self._new_fetcher()
        return True

    def _capture_start(self) -> EpochStart:
        return EpochStart.capture(self._loader, self._base_seed, self._dataset_start)

    def _next_index(self) -> Any:
        if self._epoch_start is None:
            self._epoch_start = self._capture_start()
        index = super()._next_index()
        self._taken += 1
        return index

    def _next_data(self) -> Any:
        ahead = self._draws_ahead
        if ahead is not None:
            ahead.show()  # the draws a checkpoint asked for ahead of this next()
            self._draws_ahead = None
            if ahead.error is not None:
                raise ahead.error  # the sampler's, where DataLoader's next() raises it
        try:
            return super()._next_data()
        except StopIteration:
            self._finished = True
            raise

    def progress(self, *, confirm_end: bool = True) -> dict[str, Any] | None:
        """This epoch's checkpoint record, or None once the epoch is over.

        Args:
            confirm_end: when every batch ``len()`` promises was yielded, ask
                the sampler for one more index to confirm the end, as the next
                ``next()`` would (False: take ``len()``'s word).
        """
        if self._finished:
            return None
        if self._epoch_start is None:
            # Before the first next(): nothing of the epoch is drawn yet. The
            # record is where it starts now; resuming it makes the epoch's
            # draws for good ("fresh"), as this iterator would have.
            return progress_record(self._capture_start(), 0, [], self._num_yielded, fresh=True,
                                   **self._dataset_states())
        if self._all_received(confirm_end):
            return None
        return progress_record(self._epoch_start, self._taken, [], self._num_yielded, **self._dataset_states())

    def _dataset_states(self) -> dict[str, Any]:
        """The dataset's own state for a record (see progress_record), after the received batches."""
        if not dataset_has_state(self._dataset):
            return {}
        now = [dataset_state_of(self._dataset)]
        if self._dataset_kind != DatasetKind.Iterable:
            return {"worker_states": now}  # the received batches are not fetched again
        return {"iter_states": [self._iter_state], "resume_states": now}

    def _progress_on_drop(self) -> dict[str, Any] | None:
        # A dropped iterator (break, or zip() with a loader as long) is never
        # asked for another index, as DataLoader's is not: stepping its sampler
        # here would run code after the sampler's last yield (RandomSampler's
        # trailing randperm moves the generator, and every later shuffle).
        return self.progress(confirm_end=False)

    def _all_received(self, confirm_end: bool) -> bool:
        # Every batch of a map-style epoch was yielded (a checkpoint at its last
        # batch): the epoch is over, as for the threaded iterator.
        if self._dataset_kind == DatasetKind.Iterable or self._epoch_start is None:
            return False
        try:
            if self._taken < len(self._index_sampler):
                return False
        except TypeError:  # a sampler without len()
            return False
        if not confirm_end:
            return True
        if self._draws_ahead is not None:  # asked already (an earlier checkpoint)
            self._draws_ahead.show()
            return self._draws_ahead.ended
        # Confirmed by asking the sampler for one more index, as the next
        # next() would: a sampler may draw before it stops (RandomSampler
        # does), and the RNG state saved with the checkpoint must follow it.
        # The live generators get those draws back only at that next()
        # (checkpoint_taken, _next_data).
        generators = generators_of(self._loader)
        before = [g.get_state() for g in generators]
        error = None
        try:
            extra = next(self._sampler_iter)
            self._sampler_iter = itertools.chain([extra], self._sampler_iter)
            ended = False
        except StopIteration:
            ended = True
        except Exception as e:  # noqa: BLE001 - raised by the next next(), as DataLoader's is
            ended, error = False, e
        self._draws_ahead = DrawsAhead(generators, before, ended, error)
        return ended

    def checkpoint_taken(self) -> None:
        if self._draws_ahead is not None:
            self._draws_ahead.hold_back()

