"""Inside a worker thread the global RNG API is that worker's own, as in a worker process.

DataLoader (worker processes) is the oracle: the same seed must give the same
batches when the dataset, transforms, collate or worker_init_fn draw random
numbers through the global API, and the training loop's RNG is never touched.
"""

from __future__ import annotations

import functools
import inspect
import os
import pickle
import random
import subprocess
import sys
import sysconfig
import threading
import time

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset

from threadloader import ThreadDataLoader, worker
from threadloader.worker import rng as _rng


def _same(a, b) -> bool:
    leaves_a = torch.utils._pytree.tree_leaves(a)
    leaves_b = torch.utils._pytree.tree_leaves(b)
    if len(leaves_a) != len(leaves_b):
        return False
    return all(torch.equal(torch.as_tensor(x), torch.as_tensor(y)) for x, y in zip(leaves_a, leaves_b))


def _both(dataset, seed=0, **kwargs):
    """Batches of DataLoader and ThreadDataLoader from the same global seed."""
    out = []
    for cls in (DataLoader, ThreadDataLoader):
        torch.manual_seed(seed)
        out.append(list(cls(dataset, **kwargs)))
    return out


class _GlobalDraws(Dataset):
    """Every sample draws through the global API of torch, random and numpy."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int):
        return {
            "i": i,
            "rand": torch.rand(2),
            "randn": torch.randn(1),
            "uniform_": torch.empty(2).uniform_(),
            "randint": torch.randint(0, 1000, (1,)),
            "randperm": torch.randperm(5),
            "random": random.random(),
            "randint_py": random.randint(0, 10**6),
            "np": np.random.rand(),
            "np_int": np.random.randint(0, 10**6),
            "initial_seed": torch.initial_seed() % 2**62,  # collatable as int64
            "info_seed": torch.utils.data.get_worker_info().seed % 2**62,
        }


@pytest.mark.parametrize("num_workers", [1, 3])
def test_global_draws_in_workers_match_dataloader(num_workers):
    theirs, ours = _both(_GlobalDraws(), batch_size=2, shuffle=True, num_workers=num_workers)
    assert _same(ours, theirs)
    # torch.initial_seed() in a worker is the worker's seed, as in a process.
    for batch in ours:
        assert torch.equal(batch["initial_seed"], batch["info_seed"])


def test_run_to_run_identical_and_workers_differ():
    torch.manual_seed(3)
    a = list(ThreadDataLoader(_GlobalDraws(), batch_size=2, num_workers=2))
    torch.manual_seed(3)
    b = list(ThreadDataLoader(_GlobalDraws(), batch_size=2, num_workers=2))
    assert _same(a, b)
    # Worker 0 makes batch 0, worker 1 batch 1: different streams.
    assert not torch.equal(a[0]["rand"], a[1]["rand"])


def test_persistent_workers_continue_their_streams_across_epochs():
    kwargs = dict(batch_size=3, num_workers=2, persistent_workers=True, shuffle=True)
    out = []
    for cls in (DataLoader, ThreadDataLoader):
        torch.manual_seed(7)
        loader = cls(_GlobalDraws(), **kwargs)
        out.append([list(loader) for _ in range(2)])
        del loader
    assert _same(out[1], out[0])


class _SlowAug(Dataset):
    """A random augmentation after some I/O: abandoned epochs leave tasks queued."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> tuple:
        time.sleep(0.02)
        return torch.rand(1).item(), random.random(), float(np.random.rand())


@pytest.mark.parametrize("worker_processes", [0, 1])
def test_persistent_workers_abandoned_epoch_advances_worker_streams_as_dataloader(worker_processes):
    # DataLoader's persistent worker processes still run the tasks queued for
    # an epoch the loop left with ``break`` (their results are dropped), so the
    # next epoch's augmentations are fixed. Dropping queued tasks instead made
    # them depend on timing.
    def next_epoch(cls, **kwargs):
        torch.manual_seed(0)
        loader = cls(_SlowAug(), batch_size=2, num_workers=2, persistent_workers=True, **kwargs)
        for _ in loader:
            break
        return [b for b in loader]

    want = next_epoch(DataLoader)
    for _ in range(2):
        assert _same(next_epoch(ThreadDataLoader, worker_processes=worker_processes), want)


def test_random_collate_fn_matches_dataloader():
    def mix(batch):  # a random collate (mixup-like), runs in the worker
        x = torch.stack([b["rand"] for b in batch])
        return x * torch.rand(len(batch), 1)

    theirs, ours = _both(_GlobalDraws(), batch_size=3, num_workers=2, collate_fn=mix)
    assert _same(ours, theirs)


# --- worker_init_fn seeding ----------------------------------------------------------

def _reseeding_init(worker_id: int) -> None:
    torch.manual_seed(12345 + worker_id)


def _seed_worker(worker_id: int) -> None:
    # The recipe from torch's "Reproducibility" notes.
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)


@pytest.mark.parametrize("init_fn", [_reseeding_init, _seed_worker])
def test_worker_init_fn_seeding_stays_in_the_worker(init_fn):
    torch.manual_seed(1)
    before = torch.initial_seed(), torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    theirs, ours = _both(_GlobalDraws(), seed=1, batch_size=2, num_workers=3, worker_init_fn=init_fn)
    assert _same(ours, theirs)
    torch.manual_seed(1)
    list(ThreadDataLoader(_GlobalDraws(), batch_size=2, num_workers=3, worker_init_fn=init_fn))
    # Only the loader's own base-seed draw moved the main generator, as in DataLoader.
    assert torch.initial_seed() == before[0] == 1
    torch.manual_seed(1)
    list(DataLoader(_GlobalDraws(), batch_size=2, num_workers=3, worker_init_fn=init_fn))
    expected_state = torch.get_rng_state()
    torch.manual_seed(1)
    list(ThreadDataLoader(_GlobalDraws(), batch_size=2, num_workers=3, worker_init_fn=init_fn))
    assert torch.equal(torch.get_rng_state(), expected_state)
    assert random.getstate() == before[2]
    assert np.array_equal(np.random.get_state()[1], before[3])


def test_seed_worker_recipe_gives_each_worker_its_own_seed():
    seen = {}
    lock = threading.Lock()

    def init(worker_id):
        _seed_worker(worker_id)
        with lock:
            seen[worker_id] = (torch.initial_seed(), np.random.rand(), random.random())

    list(ThreadDataLoader(_GlobalDraws(), batch_size=4, num_workers=3, worker_init_fn=init))
    assert len({v[0] for v in seen.values()}) == 3
    assert len({v[1] for v in seen.values()}) == 3 and len({v[2] for v in seen.values()}) == 3


# --- torchvision training transforms ---------------------------------------------------

@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    from PIL import Image

    root = tmp_path_factory.mktemp("imagefolder")
    gen = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        (root / cls).mkdir()
        for i in range(6):
            h, w = 24 + 4 * i, 40 - 2 * i
            Image.fromarray(gen.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / cls / f"{i}.png")
    return str(root)


def _recipe(version: str):
    if version == "v1":
        from torchvision import transforms as T

        return T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.PILToTensor()])
    from torchvision.transforms import v2

    return v2.Compose([v2.PILToTensor(), v2.RandomResizedCrop(16, antialias=True), v2.RandomHorizontalFlip()])


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_torchvision_random_augmentations_match_dataloader(image_folder, version):
    pytest.importorskip("torchvision")
    from torchvision.datasets import ImageFolder

    dataset = ImageFolder(image_folder, transform=_recipe(version))
    kwargs = dict(batch_size=4, shuffle=True, num_workers=2)
    theirs, ours = _both(dataset, seed=0, **kwargs)
    assert _same(ours, theirs)  # pixels and labels
    torch.manual_seed(0)
    again = list(ThreadDataLoader(dataset, **kwargs))
    assert _same(again, ours)


# --- Lightning / Fabric ----------------------------------------------------------------

def test_lightning_pl_worker_init_function_matches_dataloader():
    seed_mod = pytest.importorskip("lightning.fabric.utilities.seed")
    init = functools.partial(seed_mod.pl_worker_init_function, rank=0)
    for seed in (0, 1, 5):  # seed 0 made `initial_seed() - worker_id` negative before
        theirs, ours = _both(_GlobalDraws(), seed=seed, batch_size=2, num_workers=3, worker_init_fn=init)
        assert _same(ours, theirs)
        assert torch.initial_seed() == seed  # the main process was not reseeded


def test_fabric_seed_everything_default_installs_a_working_worker_init_fn(monkeypatch):
    pytest.importorskip("lightning")
    from lightning.fabric import Fabric

    monkeypatch.delenv("PL_SEED_WORKERS", raising=False)
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    fabric = Fabric(accelerator="cpu", devices=1)
    out = []
    for cls in (DataLoader, ThreadDataLoader):
        fabric.seed_everything(0)  # workers=True by default
        assert os.environ.get("PL_SEED_WORKERS") == "1"
        loader = fabric.setup_dataloaders(cls(_GlobalDraws(), batch_size=2, num_workers=2))
        assert type(getattr(loader, "_dataloader", loader)) is cls  # Fabric kept our loader
        out.append(list(loader))
        assert torch.initial_seed() == 0
    assert _same(out[1], out[0])


# --- torch.compile in the training loop while workers draw -----------------------------

class _Busy(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        return torch.rand(64).sum() + torch.randn(8).mean()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_random_step_unaffected_by_running_workers(backend):
    def step(x):
        return torch.nn.functional.dropout(x, 0.5, training=True) + torch.rand_like(x)

    compiled = torch.compile(step, backend=backend)
    x = torch.ones(16)
    torch.manual_seed(0)
    alone = [compiled(x) for _ in range(8)]
    torch.manual_seed(0)
    loader_gen = torch.Generator().manual_seed(0)  # keeps the main generator out of the loader
    with_workers = []
    for _ in ThreadDataLoader(_Busy(), batch_size=8, num_workers=2, generator=loader_gen):
        with_workers.append(compiled(x))
    assert _same(with_workers, alone)


def _graph_recorder():
    """A torch.compile backend that runs the graph as it is and keeps the targets it calls."""
    targets = []

    def backend(gm, example_inputs):
        targets.extend(n.target for n in gm.graph.nodes if n.op in ("call_function", "call_method"))
        return gm.forward

    return backend, targets


def test_fullgraph_compile_of_random_ops_outside_workers_keeps_torchs_operators():
    backend, targets = _graph_recorder()

    def f(x):
        y = torch.empty(3)
        y.uniform_()
        return x + torch.rand(3) + y + torch.randint(0, 5, (3,))

    compiled = torch.compile(f, backend=backend, fullgraph=True)
    torch.manual_seed(0)
    a = compiled(torch.zeros(3))
    torch.manual_seed(0)
    assert torch.equal(a, f(torch.zeros(3)))
    # torch's own functions in the graph, not the wrappers bound at torch.rand...
    assert {torch._C._VariableFunctions.rand, torch._C._VariableFunctions.randint, "uniform_"} <= set(targets)
    assert not any(getattr(t, "__module__", None) == _rng.__name__ for t in targets)


_IMPORT_ORDER_SCRIPT = """
import sys, torch
from torch import randn as bound_early  # torch's own, bound before the routing
if sys.argv[1] == "dynamo_first":
    import torch._dynamo
import threadloader.worker.info  # installs the routing
assert torch.rand is not torch._C._VariableFunctions.rand
targets = []
def backend(gm, example_inputs):
    targets.extend(n.target for n in gm.graph.nodes if n.op in ("call_function", "call_method"))
    return gm.forward
@torch.compile(backend=backend, fullgraph=True)
def f(x):
    y = torch.empty(3)
    torch.nn.init.normal_(y)
    return x + torch.rand(3) + bound_early(3) + y
f(torch.zeros(3))
VF = torch._C._VariableFunctions
assert {VF.rand, VF.randn, "normal_"} <= set(targets), targets
with torch.device("meta"):  # torch's factory functions still take the context's device
    assert {torch.rand(2).device.type, torch.randn(2).device.type, torch.randint(3, (2,)).device.type} == {"meta"}
print("ok")
"""


@pytest.mark.parametrize("order", ["dynamo_first", "dynamo_after"])
def test_compile_and_device_contexts_whatever_the_import_order(order):
    # Dynamo reads torch's functions by name when it is imported, and torch
    # builds its table of factory functions on first use: both before and
    # after the routing takes the names, they must keep torch's own.
    out = subprocess.run([sys.executable, "-c", _IMPORT_ORDER_SCRIPT, order], capture_output=True, text=True,
                         timeout=600)
    assert out.stdout.split() == ["ok"], out.stderr[-3000:]


# --- the routing itself ----------------------------------------------------------------

def _in_worker(fn, base_seed=100, worker_id=1):
    """Run ``fn`` in a fresh thread made a worker; return its result (or raise what it raised)."""
    out = {}

    def body():
        worker.enter_worker(worker_id, worker_id + 1, base_seed, None)
        try:
            out["modes"] = torch._C._len_torch_function_stack()
            out["value"] = fn()
        except BaseException as e:  # re-raised in the calling thread
            out["error"] = e
        finally:
            worker.leave_worker()

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    assert out["modes"] == 0  # the routing pushes no torch function mode
    return out["value"]


def _reference(seed=101):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


_TORCH_SAMPLERS = {
    "rand": lambda g=None: torch.rand(3, generator=g),
    "randn": lambda g=None: torch.randn(3, generator=g),
    "randint": lambda g=None: torch.randint(0, 9, (3,), generator=g),
    "randint_hi": lambda g=None: torch.randint(9, (3,), generator=g),
    "randperm": lambda g=None: torch.randperm(7, generator=g),
    "normal": lambda g=None: torch.normal(torch.zeros(3), torch.ones(3), generator=g),
    "normal_floats": lambda g=None: torch.normal(0.0, 1.0, (3,), generator=g),
    "bernoulli": lambda g=None: torch.bernoulli(torch.full((5,), 0.5), generator=g),
    "multinomial": lambda g=None: torch.multinomial(torch.ones(6), 3, generator=g),
    "poisson": lambda g=None: torch.poisson(torch.full((3,), 4.0), generator=g),
    "rand_like": lambda g=None: torch.rand_like(torch.zeros(3), generator=g),
    "randn_like": lambda g=None: torch.randn_like(torch.zeros(3), generator=g),
    "randint_like": lambda g=None: torch.randint_like(torch.zeros(3), 9, generator=g),
    "uniform_": lambda g=None: torch.empty(3).uniform_(generator=g),
    "normal_": lambda g=None: torch.empty(3).normal_(generator=g),
    "random_": lambda g=None: torch.empty(3).random_(0, 9, generator=g),
    "bernoulli_": lambda g=None: torch.empty(3).bernoulli_(0.5, generator=g),
    "exponential_": lambda g=None: torch.empty(3).exponential_(generator=g),
    "geometric_": lambda g=None: torch.empty(3).geometric_(0.3, generator=g),
    "log_normal_": lambda g=None: torch.empty(3).log_normal_(generator=g),
    "cauchy_": lambda g=None: torch.empty(3).cauchy_(generator=g),
    "nn.init.normal_": lambda g=None: torch.nn.init.normal_(torch.empty(3), generator=g),
    "nn.init.kaiming_uniform_": lambda g=None: torch.nn.init.kaiming_uniform_(torch.empty(2, 3), generator=g),
    "nn.init.kaiming_normal_": lambda g=None: torch.nn.init.kaiming_normal_(torch.empty(2, 3), generator=g),
    "nn.init.uniform_": lambda g=None: torch.nn.init.uniform_(torch.empty(3), generator=g),
    "nn.init.xavier_normal_": lambda g=None: torch.nn.init.xavier_normal_(torch.empty(2, 3), generator=g),
    "nn.init.orthogonal_": lambda g=None: torch.nn.init.orthogonal_(torch.empty(3, 3), generator=g),
    "nn.init.trunc_normal_": lambda g=None: torch.nn.init.trunc_normal_(torch.empty(3), generator=g),
    "binomial": lambda g=None: torch.binomial(torch.full((3,), 10.0), torch.full((3,), 0.5), generator=g),
    "_standard_gamma": lambda g=None: torch._standard_gamma(torch.full((3,), 2.0), generator=g),
    "_sample_dirichlet": lambda g=None: torch._sample_dirichlet(torch.ones(2, 3), generator=g),
    "rrelu": lambda g=None: torch.rrelu(-torch.ones(3), 0.1, 0.3, True, generator=g),
    "rrelu_": lambda g=None: torch.rrelu_(-torch.ones(3), 0.1, 0.3, True, generator=g),
    "F.rrelu_": lambda g=None: torch.nn.functional.rrelu_(-torch.ones(3), 0.1, 0.3, True, generator=g),
    "_nn.rrelu_with_noise": lambda g=None: torch._C._nn.rrelu_with_noise(-torch.ones(3), torch.empty(3), 0.1, 0.3,
                                                                         True, generator=g),
    "_nn.rrelu_with_noise_": lambda g=None: torch._C._nn.rrelu_with_noise_(-torch.ones(3), torch.empty(3), 0.1,
                                                                           0.3, True, generator=g),
    "Tensor.bernoulli": lambda g=None: torch.full((5,), 0.5).bernoulli(generator=g),
    "Tensor.multinomial": lambda g=None: torch.ones(6).multinomial(3, generator=g),
    "distributions.Normal": lambda g=None: (
        torch.distributions.Normal(0.0, 1.0).sample((3,)) if g is None else torch.normal(0.0, 1.0, (3,), generator=g)
    ),
}


@pytest.mark.parametrize("name", sorted(_TORCH_SAMPLERS))
def test_torch_samplers_without_generator_use_the_workers(name):
    sampler = _TORCH_SAMPLERS[name]
    main_state = torch.get_rng_state()
    got = _in_worker(lambda: (sampler(), sampler()))
    g = _reference()
    assert _same(got, (sampler(g), sampler(g)))
    assert torch.equal(torch.get_rng_state(), main_state)  # the main generator never moved


#: Operators with no CPU kernel: they are wrapped, but only a CUDA tensor can call them (left to CUDA's generator).
_CUDA_ONLY = {"_fused_dropout"}


def _sampler_for(wrapper) -> str:
    """The entry of ``_TORCH_SAMPLERS`` that exercises the operator ``wrapper`` stands for."""
    module, qualname = wrapper.__module__, wrapper.__qualname__
    if qualname.startswith("Tensor."):
        name = qualname[len("Tensor."):]
        return name if name.endswith("_") else qualname
    return {"torch": "", "torch._C._nn": "_nn.", "torch.nn.functional": "F."}[module] + qualname


def _attributes():
    """Every attribute of the namespaces the routing may touch, as they are now."""
    return {ns: dict(vars(ns)) for ns in (torch, torch.Tensor, torch._C._nn, torch.nn.functional, torch.special)}


def test_every_operator_taking_a_generator_is_wrapped_where_it_is_looked_up():
    _rng.uninstall()
    try:
        operators = _rng._operators_taking_generator()
        before = _attributes()
    finally:
        _rng.install()
    after = _attributes()
    assert len(operators) >= 25 and not any(inspect.isfunction(op) for op in operators)
    assert operators <= {orig for _ns, _name, _own, orig, _w in _rng._wrapped_ops}
    # Only the random operators changed, each to its wrapper; nothing else (x.add...) did.
    changed = {(ns, name) for ns in after for name in set(before[ns]) | set(after[ns])
               if before[ns].get(name, None) is not after[ns].get(name, None)}
    assert changed == {(ns, name) for ns, name, _own, _orig, _w in _rng._wrapped_ops}
    for ns, name, _own, orig, wrapper in _rng._wrapped_ops:
        assert getattr(ns, name) is wrapper and wrapper.__wrapped__ is orig
        assert wrapper.__name__ == name and wrapper.__doc__ == orig.__doc__
        assert _sampler_for(wrapper) in _TORCH_SAMPLERS or name in _CUDA_ONLY, wrapper.__qualname__
    assert torch.add is torch._C._VariableFunctions.add and torch.Tensor.add is torch._C.TensorBase.add


def test_torch_calls_in_a_worker_run_without_a_function_mode():
    from threadloader._platform import torch_compat as _torch_compat

    class Probe(torch.overrides.TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.seen.append((func, tuple(kwargs or ())))
            return func(*args, **(kwargs or {}))

    def body():
        x = torch.zeros(8)
        modes = [_torch_compat.top_function_mode()]
        x.add(1).mul(2).sum()
        torch.rand(2)
        modes.append(_torch_compat.top_function_mode())
        with Probe() as probe:
            x.add(1)
            torch.rand(2)
        return modes, probe.seen

    modes, seen = _in_worker(body)
    assert modes == [None, None]
    # A mode of the user's sees the calls as torch's own: the random op with the worker's generator.
    assert seen[0] == (torch.Tensor.add, ())
    assert seen[1] == (torch._C._VariableFunctions.rand, ("generator",))


_SIZED = {
    "rand": lambda n, g=None: torch.rand(n, generator=g),
    "randn": lambda n, g=None: torch.randn(n, 2, generator=g),
    "randint": lambda n, g=None: torch.randint(0, 100, (n,), generator=g),
    "randperm": lambda n, g=None: torch.randperm(n + 1, generator=g),
    "normal": lambda n, g=None: torch.normal(torch.zeros(n), torch.ones(n), generator=g),
    "bernoulli": lambda n, g=None: torch.bernoulli(torch.full((n,), 0.3), generator=g),
    "multinomial": lambda n, g=None: torch.multinomial(torch.ones(n + 1), 1, generator=g),
    "poisson": lambda n, g=None: torch.poisson(torch.full((n,), 3.0), generator=g),
    "randn_like": lambda n, g=None: torch.randn_like(torch.zeros(n), generator=g),
    "uniform_": lambda n, g=None: torch.empty(n).uniform_(-1, 1, generator=g),
    "normal_": lambda n, g=None: torch.empty(n, 2).normal_(generator=g),
    "random_": lambda n, g=None: torch.empty(n).random_(0, 50, generator=g),
    "exponential_": lambda n, g=None: torch.empty(n).exponential_(generator=g),
    "Parameter.uniform_": lambda n, g=None: torch.nn.Parameter(torch.empty(n), False).uniform_(generator=g),
    "nn.init.xavier_uniform_": lambda n, g=None: torch.nn.init.xavier_uniform_(torch.empty(n, 3), generator=g),
}


def test_every_python_function_taking_a_generator_is_checked_in_a_worker():
    """nn.init's functions (and any of F's) hand their generator to the wrapped operators: each one is exercised here."""
    def takes_generator(fn) -> bool:
        try:
            return "generator" in inspect.signature(fn).parameters
        except ValueError:  # our wrappers of builtin operators (F.rrelu_): no signature to read
            return False

    found = {f"{'nn.init' if ns is torch.nn.init else 'F'}.{name}"
             for ns in (torch.nn.init, torch.nn.functional) for name in dir(ns)
             if not name.startswith("_") and inspect.isfunction(fn := getattr(ns, name)) and takes_generator(fn)}
    assert "nn.init.normal_" in found
    checked = set(_TORCH_SAMPLERS) | set(_SIZED) | set(_AS_IN_A_PROCESS)
    assert found <= checked, sorted(found - checked)


@given(st.sampled_from(sorted(_SIZED)), st.integers(1, 6), st.integers(0, 2**31))
def test_a_workers_draws_are_those_of_its_seeded_generator(name, n, seed):
    op = _SIZED[name]
    got = _in_worker(lambda: (op(n), op(n)), base_seed=seed, worker_id=0)
    g = torch.Generator().manual_seed(seed)
    assert _same(got, (op(n, g), op(n, g)))


#: Draws made inside torch's Python code, which takes no generator: in a worker
#: they must be those of a worker process, whose global generator is seeded so.
_AS_IN_A_PROCESS = {
    "F.rrelu": lambda: torch.nn.functional.rrelu(-torch.ones(4), training=True),
    "F.gumbel_softmax": lambda: torch.nn.functional.gumbel_softmax(torch.zeros(2, 5)),
    "nn.init.sparse_": lambda: torch.nn.init.sparse_(torch.empty(6, 3), 0.5),
    "nn.Linear": lambda: torch.nn.Linear(3, 2).weight.detach(),
    "Gamma": lambda: torch.distributions.Gamma(2.0, 1.0).sample((3,)),
    "Dirichlet": lambda: torch.distributions.Dirichlet(torch.ones(3)).sample(),
    "Categorical": lambda: torch.distributions.Categorical(logits=torch.zeros(4)).sample((5,)),
    "Bernoulli": lambda: torch.distributions.Bernoulli(0.3).sample((4,)),
}


@pytest.mark.parametrize("name", sorted(_AS_IN_A_PROCESS))
def test_torchs_python_samplers_in_a_worker_draw_as_in_a_worker_process(name):
    fn = _AS_IN_A_PROCESS[name]
    got = _in_worker(lambda: (fn(), fn()))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(101)  # the worker's seed: base_seed + worker_id
        want = fn(), fn()
    assert _same(got, want)


def test_dropout_in_a_worker_draws_from_the_process_generator():
    # As docs/randomness.md says: dropout draws inside torch's C++ code, where no wrapper is.
    torch.manual_seed(9)
    got, worker_moved = _in_worker(lambda: (torch.nn.functional.dropout(torch.ones(16), 0.5, training=True),
                                            not torch.equal(torch.get_rng_state(), _reference().get_state())))
    torch.manual_seed(9)
    assert torch.equal(got, torch.nn.functional.dropout(torch.ones(16), 0.5, training=True))
    assert not worker_moved


def test_outside_workers_the_wrappers_draw_as_torchs_own():
    _rng.uninstall()
    try:
        want = {}
        for name, sampler in _TORCH_SAMPLERS.items():
            torch.manual_seed(7)
            want[name] = sampler()
        want_state = torch.get_rng_state()
    finally:
        _rng.install()
    for name, sampler in _TORCH_SAMPLERS.items():
        torch.manual_seed(7)
        assert _same(sampler(), want[name]), name
    assert torch.equal(torch.get_rng_state(), want_state)


def test_torchscript_compiles_the_wrapped_operators():
    def f(x):
        return x + torch.rand(3) + torch.randint(0, 5, (3,)) + torch.normal(0.0, 1.0, (3,))

    def g(x):
        return x.uniform_() + torch.nn.functional.rrelu_(x.clone(), 0.1, 0.3, True)

    for fn in (f, g):
        scripted = torch.jit.script(fn)
        torch.manual_seed(3)
        a = scripted(torch.zeros(3))
        torch.manual_seed(3)
        assert torch.equal(a, fn(torch.zeros(3)))
    assert "aten::rand" in str(torch.jit.script(f).graph)
    scripted = torch.jit.script(f)
    got = _in_worker(lambda: scripted(torch.zeros(3)))  # TorchScript calls the operators, not Python
    assert got.shape == (3,)


def test_wrappers_pickle_as_the_functions_they_replace():
    for fn in (torch.rand, torch.randint, torch.Tensor.uniform_, torch.nn.Parameter.normal_,
               torch._C._nn.rrelu_with_noise, torch.nn.functional.rrelu_):
        assert pickle.loads(pickle.dumps(fn)) is fn
    assert (torch.rand.__name__, torch.rand.__module__, torch.rand.__qualname__) == ("rand", "torch", "rand")
    assert torch.Tensor.uniform_.__qualname__ == "Tensor.uniform_"
    assert torch.rand.__doc__ == torch._C._VariableFunctions.rand.__doc__


def test_explicit_generator_and_other_devices_are_left_alone():
    def body():
        mine = torch.Generator().manual_seed(5)
        a = torch.rand(3, generator=mine)
        meta = torch.rand(3, device="meta")  # would fail with a CPU generator injected
        b = torch.rand(3)
        return a, meta.device.type, b

    a, meta_type, b = _in_worker(body)
    assert torch.equal(a, torch.rand(3, generator=torch.Generator().manual_seed(5)))
    assert meta_type == "meta"
    assert torch.equal(b, torch.rand(3, generator=_reference()))


@pytest.mark.parametrize("call", [
    ((), {"mean": "other", "std": 1.0}),  # keyword tensor: torch.normal(mean=cuda_tensor, std=1.)
    ((0.0, "other"), {}),  # a tensor after the first argument: torch.normal(0., cuda_std)
    (("other",), {}),
    (("other",), {"device": "cpu"}),  # an explicit CPU device is the CPU's
], ids=["keyword", "second", "first", "device_cpu"])
def test_routing_leaves_draws_on_other_devices_to_their_generators(call):
    # No CUDA here: a meta tensor stands for one (it accepts a CPU generator,
    # so the routing's decision is read directly).
    other = torch.zeros(3, device="meta")
    args, kwargs = call
    args = tuple(other if a == "other" else a for a in args)
    kwargs = {k: other if v == "other" else v for k, v in kwargs.items()}
    mine = torch.Generator()
    routed = _rng._with_generator(mine, args, dict(kwargs))
    expect_cpu = kwargs.get("device") == "cpu"
    assert routed.get("generator") is (mine if expect_cpu else None)


def test_factory_draws_under_a_device_context_in_a_worker_follow_its_device():
    # ``with torch.device(...)`` is a function mode: it gives factory calls
    # without a device its device, where a CPU generator would be an error.
    def body():
        zeros = torch.zeros(2)
        with torch.device("meta"):
            meta = torch.rand(3), torch.randn(2), torch.randint(0, 5, (2,)), torch.randperm(4)
            cpu_like = torch.rand_like(zeros)  # a CPU tensor's draw stays the worker's
        return [t.device.type for t in meta], cpu_like

    devices, cpu_like = _in_worker(body)
    assert devices == ["meta"] * 4
    assert torch.equal(cpu_like, torch.rand_like(torch.zeros(2), generator=_reference()))


def test_torch_seed_functions_in_a_worker():
    def body():
        out = {"initial": torch.initial_seed()}
        state = torch.get_rng_state()
        out["first"] = torch.rand(2)
        torch.set_rng_state(state)
        out["replay"] = torch.rand(2)
        gen = torch.manual_seed(9)
        out["seeded"] = (torch.initial_seed(), torch.rand(2))
        out["is_worker_gen"] = gen is torch.utils.data.get_worker_info().rng.torch_generator
        with torch.random.fork_rng(devices=[]):
            torch.rand(5)
        out["after_fork"] = torch.rand(2)
        out["seed"] = torch.seed() == torch.initial_seed()
        return out

    main = torch.initial_seed(), torch.get_rng_state()
    out = _in_worker(body)
    assert out["initial"] == 101
    assert torch.equal(out["first"], out["replay"])
    g = torch.Generator().manual_seed(9)
    assert out["seeded"][0] == 9 and torch.equal(out["seeded"][1], torch.rand(2, generator=g))
    assert torch.equal(out["after_fork"], torch.rand(2, generator=g))
    assert out["is_worker_gen"] and out["seed"]
    assert torch.initial_seed() == main[0] and torch.equal(torch.get_rng_state(), main[1])


def test_python_random_in_a_worker_is_seeded_like_a_worker_process():
    names = ["random", "randint", "uniform", "gauss", "choice", "sample", "shuffle", "getrandbits", "choices"]

    def draws(r):
        x = list(range(10))
        r.shuffle(x)
        return [r.random(), r.randint(0, 99), r.uniform(1, 2), r.gauss(0, 1), r.choice("abc"),
                r.sample(range(50), 3), x, r.getrandbits(40), r.choices("xyz", k=4)]

    main_state = random.getstate()
    got = _in_worker(lambda: (draws(random), random.seed(4), random.random()))
    ref = random.Random(101)
    assert got[0] == draws(ref)
    assert got[2] == random.Random(4).random()
    assert random.getstate() == main_state
    for name in names:  # signatures are the originals'
        assert getattr(random, name).__wrapped__ == getattr(random._inst, name)


def test_numpy_legacy_random_in_a_worker_is_seeded_like_a_worker_process():
    from threadloader._platform.torch_compat import numpy_seed_state

    def draws(r):
        return [r.rand(2), r.randn(), r.randint(0, 99, 3), r.normal(1.0, 2.0), r.choice(5, 2), r.permutation(4),
                r.random_sample(2), r.uniform()]

    main_state = np.random.get_state()[1].copy()
    got = _in_worker(lambda: (draws(np.random), np.random.seed(3), np.random.rand(), np.random.ranf(),
                              np.random.get_bit_generator() is np.random.mtrand._rand._bit_generator
                              is not _rng._NP_SINGLETON._bit_generator))
    ref = np.random.RandomState(numpy_seed_state(100, 1))
    assert all(np.array_equal(a, b) for a, b in zip(got[0], draws(ref)))
    ref = np.random.RandomState(3)
    assert got[2] == ref.rand() and got[3] == ref.random_sample()
    assert got[4]
    assert np.array_equal(np.random.get_state()[1], main_state)


def test_worker_info_rng_holds_the_routed_generators():
    def body():
        info = torch.utils.data.get_worker_info()
        a = torch.rand(2, generator=info.rng.torch_generator)
        b = torch.rand(2)  # the same stream, as in a process where both are the global generator
        return a, b, info.rng.random_generator.random() == random.Random(101).random()

    a, b, same_random = _in_worker(body)
    assert same_random
    g = _reference()
    assert torch.equal(a, torch.rand(2, generator=g)) and torch.equal(b, torch.rand(2, generator=g))


def test_routing_is_invisible_in_the_main_thread():
    assert _rng.installed()
    assert torch._C._len_torch_function_stack() == 0
    torch.manual_seed(11)
    assert torch.initial_seed() == 11
    a = torch.rand(2)
    torch.manual_seed(11)
    assert torch.equal(a, torch.rand(2))
    random.seed(2)
    assert random.random() == random.Random(2).random()
    np.random.seed(2)
    assert np.random.rand() == np.random.RandomState(2).rand()


def test_uninstall_restores_and_reinstall_routes_again():
    from threadloader._platform import torch_compat as _torch_compat

    VF = torch._C._VariableFunctions
    wrappers = [w for *_, w in _rng._wrapped_ops]
    try:
        _rng.uninstall()
        assert random.random.__self__ is random._inst
        assert np.random.rand.__self__ is np.random.mtrand._rand
        assert "_threadloader_worker_rng" not in torch.manual_seed.__code__.co_names
        assert torch.rand is VF.rand and torch.randint is VF.randint and torch.normal is VF.normal
        assert "uniform_" not in torch.Tensor.__dict__ and torch.Tensor.uniform_ is torch._C.TensorBase.uniform_
        assert torch.nn.functional.rrelu_ is VF.rrelu_ and inspect.isbuiltin(torch._C._nn.rrelu_with_noise)
        assert not _rng._wrapped_ops
        assert all(_torch_compat.script_builtin(w) is None for w in wrappers)
        assert _torch_compat.script_builtin(torch.rand) == "aten::rand"
        scripted = torch.jit.script(_scripted_rand)  # TorchScript knows torch's own again
        assert scripted().shape == (2,)
        assert _in_worker(lambda: torch.rand(2)).shape == (2,)
    finally:
        _rng.install()
    assert _rng.installed() and getattr(random.random, "__wrapped__", None) is not None
    assert torch.rand.__wrapped__ is VF.rand and torch.Tensor.__dict__["uniform_"].__wrapped__ is \
        torch._C.TensorBase.uniform_
    assert torch.equal(_in_worker(lambda: torch.rand(2)), torch.rand(2, generator=_reference()))


def _scripted_rand():
    return torch.rand(2)


def test_rng_overhead_example_smoke(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "rng_overhead.py"
    spec = importlib.util.spec_from_file_location("example_rng_overhead", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.main(["--smoke"])
    assert {r["call"] for r in rows} >= {"torch.rand(1)", "random.random()", "np.random.rand()"}
    assert all(r["installed_ns"] > 0 and r["not_installed_ns"] > 0 for r in rows)
    assert _rng.installed() and getattr(random.random, "__wrapped__", None) is not None


def test_frame_collate_in_a_worker_runs_without_a_function_mode_and_draws_stay_routed() -> None:
    # threadloader's own kernels and the user's draws in the same worker: no
    # function mode anywhere, and the draws are still the worker's.
    from threadloader import Frame, frame_collate
    from threadloader._platform import torch_compat as _torch_compat

    seen = []

    class Probe(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return Frame(np.full((4, 4, 3), i, np.uint8))

    def collate(batch):
        seen.append(_torch_compat.top_function_mode())
        out = frame_collate(batch)
        seen.append(_torch_compat.top_function_mode())
        return out, torch.rand(1)

    got = list(ThreadDataLoader(Probe(), batch_size=2, num_workers=1, collate_fn=collate,
                                generator=torch.Generator().manual_seed(3)))
    want = list(DataLoader(Probe(), batch_size=2, num_workers=1, collate_fn=lambda b: (frame_collate(b), torch.rand(1)),
                           generator=torch.Generator().manual_seed(3)))
    assert seen == [None] * 4
    assert [g[1].item() for g in got] == [w[1].item() for w in want]
    assert all(torch.equal(g[0], w[0]) for g, w in zip(got, want))


def _check_random_state_none():
    """What ``sklearn.utils.check_random_state(None)`` and SciPy's return: NumPy's legacy singleton."""
    return np.random.mtrand._rand


class _SingletonDraws(Dataset):
    """Draws through ``np.random.mtrand._rand`` itself, as scikit-learn and SciPy code does."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        rs = _check_random_state_none()
        return rs.rand(), rs.randint(0, 10**6), rs.normal()


@pytest.mark.parametrize("worker_processes", [0, 1])
def test_numpy_legacy_singleton_in_a_worker_is_the_workers(worker_processes):
    out, after = [], []
    for cls, kw in ((DataLoader, {}), (ThreadDataLoader, {"worker_processes": worker_processes})):
        torch.manual_seed(0)
        np.random.seed(0)
        out.append(list(cls(_SingletonDraws(), batch_size=None, num_workers=2, **kw)))
        after.append(np.random.rand())  # the training loop's stream is untouched
    assert out[0] == out[1] and after[0] == after[1]


def test_numpy_legacy_singleton_outside_workers_is_numpys():
    rs = _check_random_state_none()
    assert isinstance(rs, np.random.RandomState)
    rs.seed(5)
    assert np.random.rand() == np.random.RandomState(5).rand()
    np.random.seed(6)
    assert rs.rand() == np.random.RandomState(6).rand()
    state = rs.get_state()
    assert np.array_equal(state[1], np.random.get_state()[1])
    bitgen = np.random.PCG64(7)
    np.random.set_bit_generator(bitgen)
    try:
        assert np.random.get_bit_generator() is bitgen and rs._bit_generator is bitgen
        assert rs.rand() == np.random.RandomState(np.random.PCG64(7)).rand()
    finally:
        np.random.set_bit_generator(np.random.MT19937(0))
    np.random.seed(8)
    assert np.random.rand() == np.random.RandomState(8).rand()


class _HelperThreadDraws(Dataset):
    """Hands each sample's draws to a thread of its own, as datasets with an internal pool do."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        out = {}

        def draw():
            info = torch.utils.data.get_worker_info()
            out["v"] = (torch.rand(()).item(), float(np.random.rand()), random.random(), info and (info.id, info.seed))

        # The worker draws too: in a process it and its helper share one stream.
        mine = (torch.rand(()).item(), float(np.random.rand()), random.random())
        t = threading.Thread(target=draw)
        t.start()
        t.join()
        return mine, out["v"]


def test_threads_a_worker_process_starts_draw_from_that_processs_seeded_generators():
    """With one worker per process, a helper thread's draws and worker info are DataLoader's."""
    out = []
    for cls, kw in ((DataLoader, {}), (ThreadDataLoader, {"worker_processes": 2})):
        torch.manual_seed(0)
        out.append(list(cls(_HelperThreadDraws(), batch_size=None, num_workers=2, **kw)))
    assert out[0] == out[1]
    assert out[1][0][1][:2] != out[1][1][1][:2]  # the two processes' streams differ
    assert out[1][0][0][0] != out[1][0][1][0]  # the helper continues the worker's stream


def test_numpy_seed_after_set_bit_generator_in_a_worker():
    # numpy's module seed() reseeds a non-MT19937 bit generator through its type.
    def body():
        np.random.set_bit_generator(np.random.PCG64(1))
        np.random.seed(5)
        return np.random.rand(), type(np.random.get_bit_generator()).__name__

    assert _in_worker(body) == (np.random.RandomState(np.random.PCG64(5)).rand(), "PCG64")


class _CompiledDraws(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return _compiled_augment(torch.full((3,), float(i)))


def _augment(x):
    return (x * 2).sin() + torch.rand(3) + torch.randn(3).cos()


_compiled_augment = torch.compile(_augment, backend="eager")


def test_importing_threadloader_does_not_import_dynamo():
    # torch._dynamo costs seconds to import, and on a free-threaded build it
    # imports triton, which turns the GIL back on: only torch.compile may.
    code = ("import sys, torch\nbefore = 'torch._dynamo' in sys.modules\n"
            "import threadloader, threadloader.io, threadloader.worker.rng\n"
            "print(before, 'torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["False", "False"], out.stderr[-2000:]


@pytest.mark.parametrize("worker_processes", [0, 1])
def test_torch_compiled_random_function_in_workers_matches_dataloader(worker_processes):
    # The eager backend's graph calls torch.rand by name: the wrapper there routes it.
    def batches(cls, **kw):
        return list(cls(_CompiledDraws(), batch_size=None, num_workers=2,
                        generator=torch.Generator().manual_seed(3), **kw))

    kw = {"worker_processes": worker_processes}
    if worker_processes and sysconfig.get_config_var("Py_GIL_DISABLED"):
        # On a free-threaded build (torch 2.11), Dynamo in a process forked
        # after threads here ran the compiled function (the [0] case) crashes
        # or spins now and then when two threads call it there (1 run in
        # about 30; never without [0] first, nor with the GIL): a child from
        # the forkserver starts clean.
        kw["multiprocessing_context"] = "forkserver"
    assert _same(batches(ThreadDataLoader, **kw), batches(DataLoader))


@pytest.mark.parametrize("fullgraph", [False, True])
def test_compiled_random_ops_in_a_worker(fullgraph):
    # As docs/randomness.md says: the eager backend's graph routes (it calls
    # torch.rand by name); aot_eager's and inductor's call torch's operators,
    # which draw from the process-wide generator. Neither is refused.
    def aug(x):
        return (x * 2).sin() + torch.rand(3)

    for backend, routed in (("eager", True), ("aot_eager", False)):
        compiled = torch.compile(aug, backend=backend, fullgraph=fullgraph)
        torch.manual_seed(5)
        got = _in_worker(lambda: compiled(torch.zeros(3)))
        g = _reference() if routed else torch.Generator().manual_seed(5)
        assert torch.allclose(got, torch.zeros(3).sin() + torch.rand(3, generator=g)), backend
