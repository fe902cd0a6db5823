"""The adapter over torch's private data-loading API still fits this torch."""

from __future__ import annotations

import threading

import torch
import torch.utils.data as tud
from torch.utils.data._utils import collate as torch_collate
from torch.utils.data._utils import worker as torch_worker

from threadloader import _torch_compat as compat


def test_get_worker_info_is_thread_local_and_falls_back_to_the_global():
    compat.install()
    compat.install()  # idempotent
    seen = {}

    def in_thread():
        info = compat.make_worker_info(1, 2, 100, dataset="ds")
        compat.set_thread_worker_info(info)
        seen["thread"] = tud.get_worker_info()
        compat.set_thread_worker_info(None)
        seen["after"] = tud.get_worker_info()

    t = threading.Thread(target=in_thread)
    t.start()
    t.join()
    assert seen["thread"].id == 1 and seen["thread"].seed == 101 and seen["thread"].worker_method == "thread"
    assert seen["after"] is None
    assert tud.get_worker_info() is None
    # A worker *process* sets torch's module global; that path must still work.
    sentinel = compat.make_worker_info(0, 1, 5, dataset=None)
    torch_worker._worker_info = sentinel
    try:
        assert tud.get_worker_info() is sentinel
    finally:
        torch_worker._worker_info = None


def test_thread_safe_generator_uses_the_thread_rng():
    info = compat.make_worker_info(0, 1, 42, dataset=None)
    compat.set_thread_worker_info(info)
    try:
        assert torch.random.thread_safe_generator() is info.rng.torch_generator
        g = torch.Generator()
        g.manual_seed(42)
        assert torch.equal(torch.rand(3, generator=torch.random.thread_safe_generator()), torch.rand(3, generator=g))
    finally:
        compat.set_thread_worker_info(None)


def test_numpy_seed_state_matches_torchs_worker_seeding():
    assert compat.numpy_seed_state(123, 4) == torch_worker._generate_state(123, 4)
    assert len(compat.numpy_seed_state(2**62, 0)) == 4


def test_default_collate_skips_shared_memory_only_in_our_threads():
    compat.install()
    assert torch_collate.default_collate_fn_map[torch.Tensor] is compat._collate_tensor_without_shm
    batch = [torch.ones(2), torch.zeros(2)]
    compat.set_thread_worker_info(compat.make_worker_info(0, 1, 0, dataset=None))
    try:
        out = tud.default_collate(batch)
        assert not out.is_shared()
        assert tud.get_worker_info() is not None  # hidden only during the stack
    finally:
        compat.set_thread_worker_info(None)
    assert torch.equal(out, torch.stack(batch))
    torch_worker._worker_info = compat.make_worker_info(0, 1, 0, dataset=None)
    try:  # a worker process still gets torch's shared-memory batch
        assert tud.default_collate(batch).is_shared()
    finally:
        torch_worker._worker_info = None


def test_private_names_exist():
    for name in ("BaseDataLoaderIter", "DatasetKind", "ExceptionWrapper", "WorkerInfo"):
        assert getattr(compat, name) is not None
    assert hasattr(compat.BaseDataLoaderIter, "_next_index")
    assert {"rng", "worker_method"} <= set(compat.WorkerInfo.__dataclass_fields__)
    fetcher = compat.create_fetcher(compat.DatasetKind.Map, [5, 6, 7], True, list, False)
    assert fetcher.fetch([2, 0]) == [7, 5]


def test_pin_memory_passthrough_without_accelerator():
    data = {"x": torch.ones(2)}
    if not torch.accelerator.is_available():
        return
    out = compat.pin_memory(data, torch.accelerator.current_accelerator().type)
    assert out["x"].is_pinned()


def test_iterable_length_warning_text():
    import pytest

    with pytest.warns(UserWarning, match=r"reported to be 3\(when accessing len\(dataloader\)\), but 4 samples"):
        compat.warn_iterable_length("ds", 3, 4, 1)


def test_resize_kernel_matches_interpolate():
    import torch.nn.functional as F

    src = torch.randint(0, 256, (1, 37, 53, 3), dtype=torch.uint8)
    out = torch.empty((1, 20, 24, 3), dtype=torch.uint8)
    compat.resize_uint8_channels_last(src, (20, 24), out)
    ref = F.interpolate(src.permute(0, 3, 1, 2), size=(20, 24), mode="bilinear", antialias=True)
    assert torch.equal(out.permute(0, 3, 1, 2), ref)


def test_new_shared_uint8():
    t = compat.new_shared_uint8((2, 3, 4))
    assert t.shape == (2, 3, 4) and t.dtype == torch.uint8 and t.is_shared()


def test_collate_walker_is_torchs():
    assert compat.collate is torch_collate.collate
    assert compat.default_collate_fn_map is torch_collate.default_collate_fn_map


def test_profiler_enabled_and_our_iterator_records_under_a_profiler():
    from threadloader import ThreadDataLoader

    assert compat.profiler_enabled() is False
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        assert compat.profiler_enabled() is True
        list(ThreadDataLoader([1, 2, 3], num_workers=1))
    names = {e.name for e in prof.events()}
    assert any(n.startswith("enumerate(DataLoader)#ThreadedLoaderIter") for n in names), sorted(names)[:20]
