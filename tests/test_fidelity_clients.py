"""Fidelity in real clients (issue 9): resume after ``break``, DistributedSampler
epochs on restart, ``ThreadDataLoader[T]``, the iterator's ``_workers``, and
warnings attributed where DataLoader's are."""

from __future__ import annotations

import io
import os
import re
import typing
import warnings

import pytest
import torch
from helpers import NoStateSampler, Squares, to_list
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, get_worker_info

from threadloader import ThreadDataLoader


def roundtrip(sd):
    """What a checkpoint file gives back."""
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


# --- resume after break ---------------------------------------------------------------

LOOPS = [(0, False), (2, False), (2, True)]  # (num_workers, persistent_workers)


@pytest.mark.parametrize("num_workers,persistent", LOOPS)
@pytest.mark.parametrize("use_generator", [False, True])
def test_state_after_break_names_the_remaining_batches(num_workers, persistent, use_generator):
    def make():
        gen = torch.Generator().manual_seed(5) if use_generator else None
        return ThreadDataLoader(Squares(23), batch_size=3, shuffle=True, num_workers=num_workers,
                                persistent_workers=persistent, generator=gen)

    torch.manual_seed(0)
    reference = make()
    expected = [to_list(reference) for _ in range(3)]

    torch.manual_seed(0)
    loader = make()
    got = [to_list(loader)]
    head = []
    for i, batch in enumerate(loader):  # the iterator is dropped by the loop on break
        head.append(to_list([batch])[0])
        if i == 2:
            break
    sd = roundtrip(loader.state_dict())
    assert sd["epoch"] is not None and sd["epoch"]["consumed_prefix"] == 3
    del loader
    torch.manual_seed(999)  # a new process: the global RNG is anywhere
    resumed = make()
    resumed.load_state_dict(sd)
    got.append(head + to_list(resumed))
    got.append(to_list(resumed))
    assert got == expected


def _two_epochs_to_the_last_batch(cls, num_workers, persistent, use_generator, *, checkpoint=False, leave=True,
                                  zip_epoch=False):
    """Two epochs each run to their last batch (left there or not), then more epochs.

    Returns:
        The epochs, two draws from torch's global RNG, and the loader generator's state.
    """
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(5) if use_generator else None
    loader = cls(Squares(8), batch_size=2, shuffle=True, num_workers=num_workers,
                 persistent_workers=persistent, generator=gen)
    epochs = []
    for _ in range(2):
        seen = []
        for i, batch in enumerate(loader):
            seen.append(to_list([batch])[0])
            if i == len(loader) - 1:
                if checkpoint and cls is ThreadDataLoader:
                    assert loader.state_dict()["epoch"] is None
                    assert loader.state_dict()["epoch"] is None  # asked twice: the same answer
                if leave:
                    break
        epochs.append(seen)
    if zip_epoch:
        epochs.append(to_list(pair[1] for pair in zip(cls(range(4), batch_size=2), loader)))
    epochs.append(to_list(loader))
    return epochs, torch.rand(2).tolist(), None if gen is None else gen.get_state()


def _assert_same_run(got, expected):
    assert got[:2] == expected[:2]
    assert (got[2] is None) == (expected[2] is None) and (got[2] is None or torch.equal(got[2], expected[2]))


@pytest.mark.parametrize("num_workers,persistent", LOOPS)
@pytest.mark.parametrize("use_generator", [False, True])
def test_leaving_at_the_last_batch_shuffles_later_epochs_as_dataloader(num_workers, persistent, use_generator):
    # break at the last batch, or zip() with a loader as long: the iterator is
    # dropped without the next() that would run the sampler past its last
    # yield (RandomSampler's trailing randperm draws from the generator).
    args = (num_workers, persistent, use_generator)
    _assert_same_run(_two_epochs_to_the_last_batch(ThreadDataLoader, *args, zip_epoch=True),
                     _two_epochs_to_the_last_batch(DataLoader, *args, zip_epoch=True))


@pytest.mark.parametrize("num_workers,persistent", LOOPS)
@pytest.mark.parametrize("use_generator", [False, True])
@pytest.mark.parametrize("leave", [True, False])
def test_a_checkpoint_at_the_last_batch_shuffles_later_epochs_as_dataloader(num_workers, persistent,
                                                                             use_generator, leave):
    # The checkpoint asks the sampler whether the epoch is over, as the next
    # next() would; the live generator must not show that draw before then
    # (after a break it never does, as with DataLoader).
    args = (num_workers, persistent, use_generator)
    _assert_same_run(_two_epochs_to_the_last_batch(ThreadDataLoader, *args, checkpoint=True, leave=leave),
                     _two_epochs_to_the_last_batch(DataLoader, *args, checkpoint=True, leave=leave))


class _FailsAfterItsLastIndex(torch.utils.data.Sampler):
    def __len__(self):
        return 2

    def __iter__(self):
        yield 0
        yield 1
        raise ValueError("the sampler failed after its last index")


def test_a_sampler_error_after_its_last_index_is_raised_by_next_not_by_a_checkpoint():
    # num_workers=0: the checkpoint at the last batch asks the sampler for one
    # more index; its error belongs to the next next(), as with DataLoader.
    def run(cls):
        loader = cls(list(range(2)), batch_size=None, sampler=_FailsAfterItsLastIndex())
        it = iter(loader)
        got = [next(it), next(it)]
        if cls is ThreadDataLoader:
            assert loader.state_dict()["epoch"] is not None  # not over: the next next() raises
        with pytest.raises(ValueError, match="failed after its last index"):
            next(it)
        return got

    assert run(ThreadDataLoader) == run(DataLoader)


def test_a_checkpoint_never_puts_torchs_global_generator_back():
    # Other threads draw from it at any time: putting its state back would
    # give them the same numbers again. A sampler drawing from it after its
    # last index moves it when the checkpoint asks.
    class DrawsAtTheEnd(torch.utils.data.Sampler):
        def __len__(self):
            return 2

        def __iter__(self):
            yield 0
            yield 1
            torch.rand(1)

    loader = ThreadDataLoader(list(range(2)), batch_size=None, sampler=DrawsAtTheEnd())
    it = iter(loader)
    next(it), next(it)
    torch.manual_seed(0)
    loader.state_dict()
    after_checkpoint = torch.rand(1)
    torch.manual_seed(0)
    torch.rand(1)
    assert torch.equal(after_checkpoint, torch.rand(1))  # the sampler's draw came first
    with pytest.raises(StopIteration):
        next(it)


@pytest.mark.parametrize("num_workers,persistent", LOOPS)
def test_break_then_a_full_epoch_is_between_epochs(num_workers, persistent):
    loader = ThreadDataLoader(Squares(10), batch_size=2, num_workers=num_workers, persistent_workers=persistent)
    for _ in loader:
        break
    assert loader.state_dict()["epoch"] is not None
    to_list(loader)  # a new iter() starts a new epoch, as DataLoader's does
    assert loader.state_dict()["epoch"] is None


def test_a_dropped_older_iterator_does_not_overwrite_the_live_position():
    loader = ThreadDataLoader(Squares(12), batch_size=2, num_workers=2)
    old = iter(loader)
    next(old)
    live = iter(loader)
    next(live), next(live)
    del old
    assert loader.state_dict()["epoch"]["consumed_prefix"] == 2
    del live
    assert loader.state_dict()["epoch"]["consumed_prefix"] == 2


# --- DistributedSampler epoch on restart ----------------------------------------------

@pytest.mark.parametrize("num_workers", [0, 2])
def test_distributed_sampler_resumes_its_epoch_when_iter_comes_before_set_epoch(num_workers):
    def make():
        ds = Squares(25)
        sampler = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=3)
        return ThreadDataLoader(ds, batch_size=2, num_workers=num_workers, sampler=sampler)

    reference = make()
    expected = []
    for e in range(3):
        reference.sampler.set_epoch(e)
        expected.append(to_list(reference))
    assert expected[0] != expected[1]

    loader = make()
    loader.sampler.set_epoch(0)
    to_list(loader)
    loader.sampler.set_epoch(1)
    it = iter(loader)
    head = to_list([next(it) for _ in range(3)])
    sd = roundtrip(loader.state_dict())
    del it, loader

    resumed = make()  # a restarted process: the sampler is back at epoch 0
    resumed.load_state_dict(sd)
    it = iter(resumed)  # Lightning creates the iterator first ...
    resumed.sampler.set_epoch(1)  # ... and calls set_epoch after
    assert head + to_list(it) == expected[1]
    resumed.sampler.set_epoch(2)
    assert to_list(resumed) == expected[2]


# --- typing ------------------------------------------------------------------------------

def test_thread_data_loader_is_generic_like_data_loader():
    alias = ThreadDataLoader[list[torch.Tensor]]
    assert typing.get_origin(alias) is ThreadDataLoader
    assert typing.get_args(alias) == (list[torch.Tensor],)
    assert len(ThreadDataLoader.__parameters__) == len(DataLoader.__parameters__) == 1

    def annotated(is_train: bool) -> ThreadDataLoader[list[torch.Tensor]]:  # torch's test_typing
        return ThreadDataLoader(Squares(4))

    loader = ThreadDataLoader[int](Squares(4), batch_size=2)
    assert isinstance(loader, ThreadDataLoader) and isinstance(loader, DataLoader)
    assert len(to_list(loader)) == 2
    assert isinstance(annotated(True), ThreadDataLoader)


# --- the iterator's _workers --------------------------------------------------------------

def _record_pid(worker_id):
    get_worker_info().dataset.pids[worker_id] = os.getpid()


class _PidDataset(Squares):
    def __init__(self, n):
        super().__init__(n)
        self.pids = {}


def test_workers_are_process_like_views_of_the_threads():
    ds = _PidDataset(12)
    loader = ThreadDataLoader(ds, batch_size=2, num_workers=2, worker_init_fn=_record_pid)
    it = iter(loader)
    workers = it._workers
    assert len(workers) == 2
    for w in workers:
        assert w.is_alive() and w.exitcode is None
        assert w.name.startswith("threadloader-worker-")
    to_list([next(it) for _ in range(2)])
    # torch's _test_get_worker_info: the pid a worker sees is its _workers pid
    assert {i: workers[i].pid for i in ds.pids} == ds.pids
    del it  # torch's exit checks: join, then not alive with exit code 0
    for w in workers:
        w.join(5)
        assert not w.is_alive()
        assert w.exitcode == 0
        w.terminate()  # clean-up code written for processes stays harmless


def test_workers_have_the_process_interface_torch_tests_use():
    it = iter(ThreadDataLoader(Squares(4), num_workers=1))
    view = it._workers[0]
    for name in ("is_alive", "join", "terminate", "pid", "exitcode", "name"):
        assert hasattr(view, name), name
    del it


# --- warnings attributed as DataLoader's ---------------------------------------------------

# Python 3.12+ warns when a multi-threaded process forks: DataLoader's worker
# processes do, threads never do, so that warning is left out of comparisons.
_FORK_WARNING = r"This process \(pid=\d+\) is multi-threaded, use of fork\(\) may lead to deadlocks"


def _record(make, use):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        use(make())
    return [(w.category, str(w.message), w.filename, w.lineno) for w in caught
            if not (w.category is DeprecationWarning and re.match(_FORK_WARNING, str(w.message)))]


def _pretend_one_cpu(monkeypatch):
    """Make DataLoader's too-many-workers check see one CPU, on every supported torch."""
    if hasattr(torch._utils, "cpu_count"):  # torch 2.12+
        monkeypatch.setattr(torch._utils, "cpu_count", lambda: 1)
    else:  # torch 2.11 asks os directly
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
        monkeypatch.setattr(os, "cpu_count", lambda: 1)


def _start(loader):
    it = iter(loader)
    next(it)
    del it


def test_too_many_workers_warning_is_attributed_as_dataloaders(monkeypatch):
    _pretend_one_cpu(monkeypatch)  # 2 workers are "too many"
    ours = _record(lambda: ThreadDataLoader(range(4), num_workers=2), _start)
    theirs = _record(lambda: DataLoader(range(4), num_workers=2), _start)
    assert len(theirs) == 2  # at construction and at iter()
    assert ours == theirs


def test_too_many_workers_warning_is_filtered_by_dataloaders_module(monkeypatch):
    _pretend_one_cpu(monkeypatch)
    for cls in (DataLoader, ThreadDataLoader):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warnings.filterwarnings("ignore", module=r"torch\.utils\.data\.dataloader")
            warnings.filterwarnings("ignore", _FORK_WARNING, DeprecationWarning)  # DataLoader's fork, 3.12+
            _start(cls(range(4), num_workers=2))
        assert caught == [], (cls.__name__, [str(w.message) for w in caught])


class _TooLong(IterableDataset):
    def __iter__(self):
        return iter(range(6))

    def __len__(self):
        return 2

    def __repr__(self):  # the message names the dataset: same text for both loaders
        return "_TooLong()"


@pytest.mark.parametrize("profiled", [False, True])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_length_warning_is_attributed_as_dataloaders(num_workers, profiled):
    import contextlib

    def use(loader):
        len(loader)
        # with a profiler running, DataLoader's step range is kept: same attribution
        with torch.autograd.profiler.profile() if profiled else contextlib.nullcontext():
            for _ in loader:  # the warning points at this line for both loaders
                pass

    ours = _record(lambda: ThreadDataLoader(_TooLong(), num_workers=num_workers), use)
    theirs = _record(lambda: DataLoader(_TooLong(), num_workers=num_workers), use)
    assert theirs and ours == theirs


# --- Accelerate ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def accelerator():
    accelerate = pytest.importorskip("accelerate")
    return accelerate.Accelerator(cpu=True)


def _plain_then_threads(accelerator, make):
    """Accelerate's own result for a DataLoader, and ours for a ThreadDataLoader."""
    from threadloader.integrations import accelerate as tl_accelerate

    plain = accelerator.prepare_data_loader(make(DataLoader))
    threaded = tl_accelerate.prepare_data_loader(accelerator, make(ThreadDataLoader))
    return plain, threaded


def test_accelerate_prepare_keeps_the_thread_loader(accelerator):
    make = lambda cls: cls(Squares(20), batch_size=4, shuffle=True, num_workers=2,  # noqa: E731
                           generator=torch.Generator().manual_seed(1))
    plain, threaded = _plain_then_threads(accelerator, make)
    assert isinstance(threaded, ThreadDataLoader)
    assert type(threaded.base_dataloader) is ThreadDataLoader
    assert to_list(threaded) == to_list(plain)
    assert threaded.stats() is not None and threaded.stats().snapshot()["batches"] == 5
    assert "epoch" in threaded.base_dataloader.state_dict()


def test_plain_accelerate_prepare_loses_the_threads(accelerator):
    # What the helper is for: Accelerate alone rebuilds a plain DataLoader.
    prepared = accelerator.prepare_data_loader(ThreadDataLoader(Squares(8), batch_size=2, num_workers=2))
    assert type(prepared.base_dataloader) is DataLoader


def test_accelerate_skip_first_batches_keeps_the_thread_loader(accelerator):
    from threadloader.integrations import accelerate as tl_accelerate

    make = lambda cls: cls(Squares(20), batch_size=3, num_workers=2)  # noqa: E731
    plain, threaded = _plain_then_threads(accelerator, make)
    skipped = tl_accelerate.skip_first_batches(accelerator, threaded, num_batches=2)
    expected = to_list(accelerator.skip_first_batches(plain, num_batches=2))
    assert type(skipped.base_dataloader) is ThreadDataLoader
    assert to_list(skipped) == expected == to_list(plain)[2:]
    # An unprepared ThreadDataLoader too.
    bare = tl_accelerate.skip_first_batches(accelerator, make(ThreadDataLoader), num_batches=2)
    assert isinstance(bare, ThreadDataLoader) and to_list(bare) == expected


class _LengthDeclined(torch.utils.data.Sampler):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self) -> int:
        raise NotImplementedError("length unknown")


@pytest.mark.parametrize("case", ["skip past the end", "sampler declining len"])
def test_accelerate_helpers_take_loaders_without_a_usable_length(accelerator, case):
    # Accelerate reads the loader's state_dict() as it wraps it; that asked
    # len(loader), which raised for a negative length (skipping past the end)
    # or a sampler declining len(): plain Accelerate takes both.
    from threadloader.integrations import accelerate as tl_accelerate

    if case == "skip past the end":
        make = lambda cls: cls(Squares(11), batch_size=3, num_workers=2)  # noqa: E731
        plain, threaded = _plain_then_threads(accelerator, make)
        expected = to_list(accelerator.skip_first_batches(plain, num_batches=5))
        got = to_list(tl_accelerate.skip_first_batches(accelerator, threaded, num_batches=5))
    else:
        make = lambda cls: cls(Squares(7), batch_size=3, sampler=_LengthDeclined(7), num_workers=2)  # noqa: E731
        plain, threaded = _plain_then_threads(accelerator, make)
        expected, got = to_list(plain), to_list(threaded)
    assert got == expected


def test_accelerate_prepare_all_at_once(accelerator):
    from threadloader.integrations import accelerate as tl_accelerate

    model = torch.nn.Linear(1, 1)
    ours = ThreadDataLoader(Squares(6), batch_size=2, num_workers=2)
    theirs = DataLoader(Squares(6), batch_size=2)
    p_model, p_ours, p_theirs = tl_accelerate.prepare(accelerator, model, ours, theirs)
    assert isinstance(p_model, torch.nn.Module)
    assert type(p_ours.base_dataloader) is ThreadDataLoader
    assert type(p_theirs.base_dataloader) is DataLoader
    assert p_ours in accelerator._dataloaders and p_theirs in accelerator._dataloaders
    assert to_list(p_ours) == to_list(p_theirs)
    import accelerate.data_loader as adl

    assert adl.DataLoader is DataLoader  # the name is restored


def test_accelerate_helpers_keep_worker_processes(accelerator):
    from threadloader.integrations import accelerate as tl_accelerate

    def make():
        return ThreadDataLoader(Squares(8), batch_size=2, num_workers=2, worker_processes=2)

    prepared = tl_accelerate.prepare_data_loader(accelerator, make())
    skipped = tl_accelerate.skip_first_batches(accelerator, make(), num_batches=1)
    (_, together) = tl_accelerate.prepare(accelerator, torch.nn.Linear(1, 1), make())
    assert [prepared.base_dataloader.worker_processes, skipped.worker_processes,
            together.base_dataloader.worker_processes] == [2, 2, 2]
    assert to_list(prepared) == to_list(DataLoader(Squares(8), batch_size=2))


def test_accelerate_reading_state_before_each_batch_does_not_stop_training(accelerator):
    # Accelerate reads state_dict() as it wraps the loader and before every
    # batch; a sampler whose state_dict() raises only makes that state
    # unloadable, as iteration goes on for a bare loader.
    from threadloader.integrations import accelerate as tl_accelerate
    from threadloader.state import CheckpointUnavailable

    prepared = tl_accelerate.prepare_data_loader(
        accelerator, ThreadDataLoader(Squares(6), batch_size=2, sampler=NoStateSampler(6, RuntimeError("cannot checkpoint")), num_workers=2))
    assert to_list(prepared) == to_list(DataLoader(Squares(6), batch_size=2))
    state = prepared.base_dataloader.state_dict()
    with pytest.raises(CheckpointUnavailable, match="cannot checkpoint"):
        ThreadDataLoader(Squares(6), batch_size=2, sampler=NoStateSampler(6)).load_state_dict(state)


def test_compat_finds_dataloaders_own_call_site():
    # The adapter attributes the warning to the line where DataLoader itself
    # calls the check; if torch moves that call, this says so.
    import linecache

    from torch.utils.data import dataloader as torch_dataloader

    from threadloader._platform import torch_compat as _torch_compat

    line = _torch_compat._call_site_line(torch_dataloader.DataLoader._get_iterator, "check_worker_number_rationality")
    assert "check_worker_number_rationality()" in linecache.getline(torch_dataloader.__file__, line)


# --- Lightning's Trainer --------------------------------------------------------------

class _ShuffledStream(IterableDataset):
    """40 samples, each worker's share in an order its own RNG draws; ``__len__`` so Lightning reads no batch ahead."""

    def __len__(self) -> int:
        return 40

    def __iter__(self):
        info = get_worker_info()
        return iter([(i,) for i in torch.randperm(40)[info.id::info.num_workers].tolist()])  # batches as TensorDataset's


def _lightning_fit(tmp_path, seen: list, seed: int, persistent: bool, ckpt_path=None, iterable: bool = False,
                   **trainer_args) -> None:
    """Fit a model that records each batch's indices, on a shuffled ThreadDataLoader of 40 samples."""
    L = pytest.importorskip("lightning")

    class Recorder(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(1, 1)

        def training_step(self, batch, batch_idx):
            seen.append((self.current_epoch, batch[0].tolist()))
            return self.lin(batch[0].float().unsqueeze(1)).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

        def train_dataloader(self):
            if iterable:
                return ThreadDataLoader(_ShuffledStream(), batch_size=4, num_workers=2,
                                        persistent_workers=persistent)
            return ThreadDataLoader(torch.utils.data.TensorDataset(torch.arange(40)), batch_size=4, shuffle=True,
                                    num_workers=2, persistent_workers=persistent)

    L.seed_everything(seed, workers=True, verbose=False)
    trainer = L.Trainer(accelerator="cpu", max_epochs=3, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=tmp_path, **trainer_args)
    trainer.fit(Recorder(), ckpt_path=ckpt_path)


@pytest.mark.parametrize("stop,persistent,iterable", [(5, False, False), (10, False, False), (13, True, False),
                                                   (13, False, True)],
                         ids=["epoch0", "epoch0-end", "epoch1-persistent", "epoch1-iterable"])
def test_lightning_resumes_a_preempted_fit_mid_epoch_with_the_same_batches(tmp_path, monkeypatch, stop, persistent,
                                                                          iterable):
    # Lightning saves the loader's state_dict() in its checkpoint (the loader
    # is Stateful) and loads it on restart: the resumed fit must see the
    # batches the uninterrupted one saw, although the global RNG is elsewhere.
    from lightning.pytorch.callbacks import ModelCheckpoint

    for name in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS"):  # seed_everything sets them: restored after the test
        monkeypatch.setenv(name, "")
    full: list = []
    _lightning_fit(tmp_path / "full", full, 7, persistent, iterable=iterable)
    resumed: list = []
    ckpt = ModelCheckpoint(dirpath=tmp_path, filename="preempted", every_n_train_steps=stop)
    _lightning_fit(tmp_path / "run", resumed, 7, persistent, iterable=iterable, max_steps=stop, callbacks=[ckpt])
    assert len(resumed) == stop
    _lightning_fit(tmp_path / "run", resumed, 123, persistent, iterable=iterable, ckpt_path=tmp_path / "preempted.ckpt")
    assert len(full) == 30 and resumed == full
