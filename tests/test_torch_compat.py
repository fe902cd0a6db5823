"""The adapter over torch's private data-loading API still fits this torch."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
import torch.utils.data as tud
from torch.utils.data._utils import collate as torch_collate
from torch.utils.data._utils import worker as torch_worker

from threadloader._platform import torch_compat as compat


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


def _rng(seed):
    import random

    import numpy as np

    return compat.make_rng(random.Random(seed), torch.Generator().manual_seed(seed), np.random.default_rng(seed))


def test_thread_safe_generator_uses_the_thread_rng():
    if not hasattr(torch.random, "thread_safe_generator"):
        pytest.skip("this torch has no thread_safe_generator (2.11)")
    info = compat.make_worker_info(0, 1, 42, dataset=None, rng=_rng(42))
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
    from threadloader.worker import collate as _collate

    compat.install()
    _collate.install()
    assert torch_collate.default_collate_fn_map[torch.Tensor] is _collate.collate_tensor
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
    fields = getattr(compat.WorkerInfo, "__dataclass_fields__", None)
    if fields is not None:  # a frozen dataclass from torch 2.12 on; a plain class before
        assert {"rng", "worker_method"} <= set(fields)
    fetcher = compat.create_fetcher(compat.DatasetKind.Map, [5, 6, 7], True, list, False)
    assert fetcher.fetch([2, 0]) == [7, 5]


def test_the_base_iterator_has_the_state_and_methods_our_iterators_use():
    loader = tud.DataLoader(range(10), batch_size=3)
    it = compat.BaseDataLoaderIter(loader)
    missing = [name for name in compat.BASE_ITER_STATE if name not in vars(it)]
    assert missing == []
    assert all(callable(getattr(compat.BaseDataLoaderIter, name, None)) for name in compat.BASE_ITER_METHODS)
    assert list(it._sampler_iter) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


def test_aten_ops_taking_generator_are_the_random_ones():
    names = compat.aten_ops_taking_generator()
    assert {"normal", "randint", "randperm", "bernoulli", "multinomial", "rand"} <= names
    assert not {"add", "mul", "empty"} & names
    # the operators' functions and methods are found through the namespaces
    found = {getattr(ns, name, None) for ns in compat.OP_NAMESPACES for name in names}
    assert {torch.normal, torch.randint, torch.Tensor.bernoulli_, torch.Tensor.random_} <= found


def _calls_twice():
    x = 1
    print(x)
    return len([x])


def test_call_site_line_on_instructions_without_positions(monkeypatch):
    # Python 3.10's dis.Instruction has no `positions`: the line comes from starts_line.
    import collections
    import dis

    first = _calls_twice.__code__.co_firstlineno
    assert compat._call_site_line(_calls_twice, "len") == first + 3
    old = collections.namedtuple("Instruction", "opname argval starts_line")
    real = dis.get_instructions

    def starts_line(i):  # the line an instruction starts, or None (a bool and line_number from 3.13)
        return (i.line_number if i.starts_line else None) if isinstance(i.starts_line, bool) else i.starts_line

    monkeypatch.setattr(dis, "get_instructions", lambda code: [
        old(i.opname, i.argval, starts_line(i)) for i in real(code)])
    assert compat._call_site_line(_calls_twice, "print") == first + 2
    assert compat._call_site_line(_calls_twice, "len") == first + 3


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


def test_new_shared():
    t = compat.new_shared((2, 3, 4))
    assert t.shape == (2, 3, 4) and t.dtype == torch.uint8 and t.is_shared()
    f = compat.new_shared((2, 3), torch.float64)
    assert f.shape == (2, 3) and f.dtype == torch.float64 and f.is_shared() and f.is_contiguous()


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


def test_make_worker_info_on_a_torch_without_dataclass_worker_info(monkeypatch):
    # torch 2.11: WorkerInfo is a plain class taking any keyword, with no rng,
    # no worker_method and no _RNG container.
    class OldWorkerInfo:
        def __init__(self, **kwargs):
            for k, v in kwargs.items():
                setattr(self, k, v)

    monkeypatch.setattr(compat, "WorkerInfo", OldWorkerInfo)
    monkeypatch.delattr(torch_worker, "_RNG", raising=False)
    rng = _rng(7)
    assert isinstance(rng, compat._ThreadRNG) and rng.torch_generator.initial_seed() == 7
    info = compat.make_worker_info(2, 4, 10, dataset="ds", rng=rng)
    assert (info.id, info.num_workers, info.seed, info.dataset) == (2, 4, 12, "ds")
    assert info.worker_method == "thread" and info.rng is rng


def test_make_worker_info_fills_the_dataclass_fields_this_torch_has():
    rng = _rng(3)
    info = compat.make_worker_info(1, 2, 5, dataset=None, rng=rng)
    fields = getattr(compat.WorkerInfo, "__dataclass_fields__", {})
    if "rng" in fields:
        assert info.rng is rng and info.rng.torch_generator.initial_seed() == 3
    if "worker_method" in fields:
        assert info.worker_method == "thread"
    assert info.seed == 6


def test_datapipe_worker_copy_is_the_whole_graph_anew_in_torchs_wrapper():
    from torch.utils.data import DataLoader
    from torch.utils.data.datapipes.iter import IterableWrapper

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = DataLoader(IterableWrapper(range(4)).map(lambda x: x + 1), batch_size=None)
    dataset = loader.dataset  # DataLoader wrapped the graph
    copy = compat.datapipe_worker_copy(dataset)
    assert type(copy) is type(dataset) and copy is not dataset
    assert copy._datapipe is not dataset._datapipe  # the pipes: a worker's own
    assert copy._datapipe.fn is dataset._datapipe.fn  # the lambda: shared, not pickled
    assert list(copy) == list(dataset) == [1, 2, 3, 4]


def _stand_in(original):
    def stand_in(*args, **kwargs):
        return original(*args, **kwargs)

    return stand_in


def test_compile_as_makes_dynamo_trace_the_original():
    stand_in = _stand_in(torch._C._VariableFunctions.randn)
    compat.compile_as(stand_in, torch._C._VariableFunctions.randn)
    targets = []

    def backend(gm, example_inputs):
        targets.extend(n.target for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    @torch.compile(backend=backend, fullgraph=True)
    def f(x):
        return x + stand_in(3)

    torch.manual_seed(0)
    a = f(torch.zeros(3))
    torch.manual_seed(0)
    assert torch.equal(a, torch.randn(3))
    assert torch._C._VariableFunctions.randn in targets and stand_in not in targets


def test_script_builtin_registration_round_trip():
    stand_in = _stand_in(torch._C._VariableFunctions.rand)
    assert compat.script_builtin(stand_in) is None
    assert compat.script_builtin(torch._C._VariableFunctions.rand) == "aten::rand"
    compat.register_script_builtin(stand_in, "aten::rand")
    try:
        assert compat.script_builtin(stand_in) == "aten::rand"

        def f():
            return stand_in(2)

        assert torch.jit.script(f)().shape == (2,)
    finally:
        compat.unregister_script_builtin(stand_in)
    assert compat.script_builtin(stand_in) is None
    compat.unregister_script_builtin(stand_in)  # nothing to undo: no error


def test_pin_function_tables_keeps_torchs_own_functions():
    from torch.utils import _device

    compat.pin_function_tables()
    assert torch._C._VariableFunctions.randn in _device._device_constructors()
    assert torch._C._VariableFunctions.bernoulli in set().union(*torch.overrides._get_overridable_functions()[0].values())


def test_context_device_type():
    assert compat.context_device_type() is None and compat.function_mode_depth() == 0
    with torch.device("meta"):
        assert compat.context_device_type() == "meta" and compat.function_mode_depth() == 1

        class Other(torch.overrides.TorchFunctionMode):
            pass

        with Other():  # the device context below another mode still counts
            assert compat.context_device_type() == "meta"
    with torch.device("cpu"):
        assert compat.context_device_type() == "cpu"
    assert compat.context_device_type() is None
