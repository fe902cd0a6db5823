"""The one place that touches torch's private data-loading API.

Everything threadloader needs from ``torch.utils.data`` internals is named here,
so a torch upgrade that moves something breaks this file (and its tests in
``tests/test_torch_compat.py``) and nothing else.

Two behaviours of torch have to be adjusted for worker *threads*:

* ``torch.utils.data.get_worker_info()`` reads one module global, which is right
  for worker processes and wrong for threads (every thread would see the last
  writer's info). :func:`install` makes the function consult a thread-local
  first. The function object is patched in place (its code is swapped), so every
  alias of it -- ``torch.utils.data.get_worker_info``, names users imported
  earlier, ``torch.random.thread_safe_generator``'s lazy import -- sees the
  thread-local value. Outside our threads it returns exactly what it did before.
* ``default_collate`` stacks tensors into *shared memory* whenever worker info
  is set. :func:`replace_collate_tensor` swaps its tensor entry for the one
  :mod:`threadloader.worker.collate` writes (where batches go is decided there), and
  :func:`worker_info_hidden` lets that entry run torch's own with the worker
  info hidden.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import math
import threading
import types
import warnings
from typing import Any, Callable, Iterator

import torch
from torch._utils import ExceptionWrapper
from torch.utils import _device as _device_mod
from torch.utils.data import dataloader as _dl
from torch.utils.data._utils import collate as _collate
from torch.utils.data._utils import pin_memory as _pin
from torch.utils.data._utils import signal_handling as _signal_handling
from torch.utils.data._utils import worker as _worker

from .fork import renew_after_fork

__all__ = [
    "BaseDataLoaderIter",
    "BASE_ITER_STATE",
    "BASE_ITER_METHODS",
    "SingleProcessDataLoaderIter",
    "DatasetKind",
    "ExceptionWrapper",
    "WorkerInfo",
    "make_rng",
    "numpy_seed_state",
    "create_fetcher",
    "pin_memory",
    "base_seed_of",
    "shutdown_workers",
    "install",
    "set_thread_worker_info",
    "get_thread_worker_info",
    "set_process_worker_info",
    "process_worker_info",
    "set_worker_signal_handlers",
    "aten_ops_taking_generator",
    "OP_NAMESPACES",
    "compile_as",
    "register_script_builtin",
    "unregister_script_builtin",
    "script_builtin",
    "pin_function_tables",
    "context_device_type",
    "function_mode_depth",
    "CONTEXT_VARS",
    "autocast_devices",
]

#: torch's base iterator: draws the base seed, builds the sampler iterator,
#: emits pin_memory warnings and the IterableDataset length warning.
BaseDataLoaderIter = _dl._BaseDataLoaderIter
#: The state our iterators (subclasses of it) read from it, as ``BaseDataLoaderIter.__init__`` sets it,
#: and the methods they call or override (tests check that this torch has them all).
BASE_ITER_STATE = ("_dataset", "_dataset_kind", "_IterableDataset_len_called", "_auto_collation", "_drop_last",
                   "_index_sampler", "_sampler_iter", "_num_workers", "_pin_memory", "_pin_memory_device",
                   "_timeout", "_collate_fn", "_base_seed", "_persistent_workers", "_num_yielded",
                   "_profile_name")
BASE_ITER_METHODS = ("_next_index", "_next_data", "_reset")
#: torch's ``num_workers=0`` iterator (loads in the calling thread).
SingleProcessDataLoaderIter = _dl._SingleProcessDataLoaderIter
DatasetKind = _dl._DatasetKind
WorkerInfo = _worker.WorkerInfo

#: The calling worker's info, and whether it is hidden from ``get_worker_info`` (see
#: :func:`worker_info_hidden`). Context variables: each thread starts with its own, and
#: a worker run in the consumer's thread keeps its own in its own context.
_THREAD_INFO: contextvars.ContextVar[Any] = contextvars.ContextVar("threadloader_worker_info", default=None)
_INFO_HIDDEN: contextvars.ContextVar[bool] = contextvars.ContextVar("threadloader_worker_info_hidden", default=False)
#: This module's context variables: a worker sets its own, never inherits them.
CONTEXT_VARS = frozenset({_THREAD_INFO, _INFO_HIDDEN})
_install_lock = threading.Lock()
renew_after_fork(__name__, "_install_lock")
_installed = False


def set_thread_worker_info(info: Any) -> None:
    """Set (or clear with None) the worker info seen by the current thread (its current context)."""
    _THREAD_INFO.set(info)


def get_thread_worker_info() -> Any:
    """The current thread's own worker info (None: not a worker thread)."""
    return _THREAD_INFO.get()


def set_process_worker_info(info: Any) -> None:
    """Set (or clear with None) the worker info of the whole process, as a DataLoader worker process has it.

    Seen by every thread without a worker info of its own (threads a worker
    starts); only for a child process that runs a single worker.
    """
    _worker._worker_info = info


def process_worker_info() -> Any:
    """The process-wide worker info (None outside a worker process)."""
    return _worker._worker_info


def numpy_seed_state(base_seed: int, worker_id: int) -> list[int]:
    """The 4×uint32 NumPy seed DataLoader gives worker ``worker_id``."""
    return _worker._generate_state(base_seed, worker_id)


class _ThreadRNG:
    """Stand-in for torch's ``_RNG`` container on a torch that has none (2.11)."""

    __slots__ = ("random_generator", "torch_generator", "numpy_generator")

    def __init__(self, random_generator: Any, torch_generator: Any, numpy_generator: Any = None) -> None:
        self.random_generator = random_generator
        self.torch_generator = torch_generator
        self.numpy_generator = numpy_generator


def make_rng(random_generator: Any, torch_generator: Any, numpy_generator: Any) -> Any:
    """torch's per-thread RNG container (``WorkerInfo.rng``) holding these generators."""
    rng_cls = getattr(_worker, "_RNG", None) or _ThreadRNG
    return rng_cls(random_generator, torch_generator, numpy_generator)


def make_worker_info(worker_id: int, num_workers: int, base_seed: int, dataset: Any, rng: Any = None) -> Any:
    """torch's ``WorkerInfo`` for a worker thread (``worker_method="thread"``).

    Works on torch versions where ``WorkerInfo`` is a frozen dataclass with
    ``rng``/``worker_method`` fields (2.12+) and where it is a plain class that
    takes any keyword (2.11 and older): there the same two attributes are set.

    Args:
        worker_id: 0 .. num_workers - 1.
        num_workers: the loader's ``num_workers``.
        base_seed: the iterator's base seed (``seed = base_seed + worker_id``).
        dataset: the dataset the worker reads.
        rng: the worker's generators (see :func:`make_rng`), or None.
    """
    seed = base_seed + worker_id
    kwargs: dict[str, Any] = dict(id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset)
    fields = getattr(WorkerInfo, "__dataclass_fields__", None)
    extra = {"rng": rng, "worker_method": "thread"}
    for name, value in extra.items():
        if fields is None or name in fields:
            kwargs[name] = value
    return WorkerInfo(**kwargs)


def create_fetcher(kind: int, dataset: Any, auto_collation: bool, collate_fn: Callable, drop_last: bool) -> Any:
    """torch's own fetcher for ``kind`` (used for IterableDataset replicas)."""
    return DatasetKind.create_fetcher(kind, dataset, auto_collation, collate_fn, drop_last)


#: Whether an autograd profiler is recording (DataLoader's per-step range
#: matters then). torch's C function itself: it is called once per batch.
profiler_enabled: Callable[[], bool] = torch.autograd._profiler_enabled


def warn_iterable_length(dataset: Any, reported: int, yielded: int, num_workers: int) -> None:
    """DataLoader's warning when an IterableDataset yields more than its len()."""
    import warnings

    msg = (
        f"Length of IterableDataset {dataset} was reported to be {reported}"
        f"(when accessing len(dataloader)), but {yielded} samples have been fetched. "
    )
    if num_workers > 0:
        msg += (
            "For multiprocessing data-loading, this could be caused by not properly configuring the "
            "IterableDataset replica at each worker. Please see "
            "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for examples."
        )
    # warn_iterable_length <- ThreadedLoaderIter._step <- __next__ <- the
    # user's line, which is where DataLoader's own warning points.
    warnings.warn(msg, stacklevel=4)


def _call_site_line(func: Callable, callee: str) -> int:
    """The line in ``func`` where it calls ``callee`` (its first line if not found)."""
    import dis

    code = getattr(func, "__code__", None)
    if code is None:  # pragma: no cover - not a Python function
        return 1
    line = code.co_firstlineno
    for instr in dis.get_instructions(code):
        if hasattr(instr, "positions"):  # Python 3.11+
            line = instr.positions.lineno or line
        else:  # 3.10: an instruction that starts a line carries its number
            line = instr.starts_line or line
        if instr.argval == callee:
            return line
    return code.co_firstlineno  # pragma: no cover - torch moved the call


def _caller_in_torch(lineno: int) -> Callable[..., Any]:
    """``call(fn, *args)``: runs ``fn(*args)`` from a frame that torch's dataloader module owns.

    ``warnings.warn(stacklevel=2)`` inside ``fn`` then attributes the warning
    to ``torch.utils.data.dataloader`` at ``lineno`` of its file, with its
    registry, exactly as when DataLoader's own code calls ``fn``; so
    ``warnings.filterwarnings(module="torch.utils.data.dataloader")`` and
    ``"once"``/``"default"`` actions treat both alike.
    """
    src = "\n" * max(lineno - 2, 0) + "def call(fn, *args):\n    return fn(*args)\n"
    namespace: dict[str, Any] = {}
    exec(compile(src, _dl.__file__, "exec"), namespace)  # noqa: S102 - fixed source, no user input
    return types.FunctionType(namespace["call"].__code__, _dl.__dict__, "call")


_base_init_caller: Callable[..., Any] | None = None


def init_base_iterator(it: Any, loader: Any) -> None:
    """``BaseDataLoaderIter.__init__(it, loader)``, its warnings attributed as DataLoader's are.

    Its pin-memory warnings use ``stacklevel=2``: with DataLoader they point at
    the worker iterator's ``super().__init__`` line in torch's dataloader
    module, where filters such as ``filterwarnings(module="torch.utils.data.dataloader")``
    find them. Called from our iterator's module they would point there.
    """
    global _base_init_caller
    if _base_init_caller is None:
        line = _call_site_line(_dl._MultiProcessingDataLoaderIter.__init__, "__init__")
        _base_init_caller = _caller_in_torch(line)
    _base_init_caller(BaseDataLoaderIter.__init__, it, loader)


_rationality_caller: Callable[..., Any] | None = None


def check_worker_number_rationality(loader: Any) -> None:
    """DataLoader's too-many-workers check, its warning attributed as DataLoader's is.

    ``DataLoader._get_iterator`` calls ``loader.check_worker_number_rationality()``
    from ``torch.utils.data.dataloader``, and the warning points there
    (``stacklevel=2``). Calling the method from our module would move it.
    """
    global _rationality_caller
    if _rationality_caller is None:
        line = _call_site_line(_dl.DataLoader._get_iterator, "check_worker_number_rationality")
        _rationality_caller = _caller_in_torch(line)
    _rationality_caller(loader.check_worker_number_rationality)


_worker_start_caller: Callable[..., Any] | None = None


def warn_as_worker_start(message: str) -> None:
    """Warn ``message`` (UserWarning) where DataLoader's worker-start warnings point.

    The pickle-error warning raised while starting worker processes uses
    ``stacklevel=2`` inside ``_MultiProcessingDataLoaderIter.__init__``: it
    points at ``DataLoader._get_iterator``'s line that builds that iterator.
    """
    global _worker_start_caller
    if _worker_start_caller is None:
        line = _call_site_line(_dl.DataLoader._get_iterator, "_MultiProcessingDataLoaderIter")
        _worker_start_caller = _caller_in_torch(line)
    _worker_start_caller(warnings.warn, message, UserWarning, 1)


def base_seed_of(it: Any) -> int:
    """The base seed a DataLoader iterator drew for its epoch's workers (``_base_seed``)."""
    return it._base_seed


def shutdown_workers(it: Any) -> None:
    """Shut a DataLoader iterator's workers down now, as its own finalizer does (``_shutdown_workers``)."""
    it._shutdown_workers()


def pin_memory(data: Any, device: str | None) -> Any:
    """Pin every tensor in ``data`` as DataLoader's pin-memory thread does."""
    return _pin.pin_memory(data, device)


def resize_uint8_channels_last(src: torch.Tensor, size: tuple[int, int], out: torch.Tensor) -> None:
    """Antialiased bilinear resize of a (1, H, W, C) uint8 tensor into ``out`` (1, h, w, C).

    torch's own AVX2 uint8 kernel. Called through its private op so that it
    writes straight into a channels-last output: ``F.interpolate`` returns
    NCHW, and the transpose back would add a large share of the resize's time.
    """
    resize_op(src.permute(0, 3, 1, 2), size, False, out=out.permute(0, 3, 1, 2))


def _interpolate_into(src: torch.Tensor, size: Any, align_corners: bool, *, out: torch.Tensor) -> None:
    # pragma: no cover - a torch without the private op
    out.copy_(torch.nn.functional.interpolate(src, size=tuple(size), mode="bilinear", antialias=True,
                                              align_corners=align_corners))


#: ``resize_op(src, (h, w), False, out=out)``: antialiased bilinear resize of an
#: (N, C, H, W) tensor (any strides) into ``out`` (N, C, h, w). The private op
#: itself when torch has it (no Python frame per call: frame_collate calls it
#: once per image), else a slower public equivalent.
resize_op: Callable[..., Any] = getattr(torch._C._nn, "_upsample_bilinear2d_aa", None) or _interpolate_into


def new_shared(shape: tuple[int, ...], dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """An uninitialised contiguous tensor in shared memory (what default_collate uses in worker processes)."""
    storage = torch.UntypedStorage._new_shared(math.prod(shape) * dtype.itemsize)
    return torch.empty(0, dtype=torch.uint8).set_(storage).view(dtype).view(shape)


#: torch's collate walker and its default type map (default_collate's own).
collate = _collate.collate
default_collate_fn_map = _collate.default_collate_fn_map


# --- patches -------------------------------------------------------------------

def _thread_aware_get_worker_info():  # pragma: no cover - body runs as torch's
    # Runs with torch.utils.data._utils.worker's globals (its code object is
    # installed into torch's function), hence the names below.
    info = _threadloader_info.get()  # noqa: F821
    if info is not None:
        return None if _threadloader_info_hidden.get() else info  # noqa: F821
    return _worker_info  # noqa: F821


def typed_storage(numel: int, dtype: torch.dtype, device: torch.device) -> Any:
    """A ``TypedStorage`` of ``numel`` items, made as default_collate's worker-process path makes one."""
    return torch.TypedStorage(numel, dtype=dtype, device=device, _internal=True)


#: default_collate's own tensor entry (what a worker process stacks with).
original_collate_tensor: Callable[..., Any] = _collate.collate_tensor_fn


@contextlib.contextmanager
def worker_info_hidden() -> Iterator[None]:
    """Within it, the calling thread's ``get_worker_info()`` answers None (this thread only)."""
    token = _INFO_HIDDEN.set(True)
    try:
        yield
    finally:
        _INFO_HIDDEN.reset(token)


def replace_collate_tensor(collate_tensor: Callable[..., Any]) -> None:
    """Make ``collate_tensor`` default_collate's entry for tensors, in place of torch's own (idempotent)."""
    with _install_lock:
        if _collate.default_collate_fn_map.get(torch.Tensor) is original_collate_tensor:
            _collate.default_collate_fn_map[torch.Tensor] = collate_tensor


def install() -> None:
    """Make torch's worker-info lookup thread-aware (idempotent)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        target = _worker.get_worker_info
        if target.__code__ is not _thread_aware_get_worker_info.__code__:
            if target.__code__.co_freevars or "_worker_info" not in target.__code__.co_names:
                raise RuntimeError(
                    "threadloader: this torch version's get_worker_info is not the expected "
                    "module-global lookup; threadloader's adapter needs updating"
                )
            _worker._threadloader_info = _THREAD_INFO
            _worker._threadloader_info_hidden = _INFO_HIDDEN
            target.__code__ = _thread_aware_get_worker_info.__code__
        _installed = True


# Keep a reference so tests can check the patch targets the same function.
TORCH_GET_WORKER_INFO: types.FunctionType = _worker.get_worker_info


#: Installs DataLoader's worker-process handlers for SIGBUS, SIGSEGV, SIGFPE
#: (a message on stderr, then the default action) and SIGTERM.
set_worker_signal_handlers: Callable[[], None] = _signal_handling._set_worker_signal_handlers


# --- torch's random ops (the worker-thread RNG routing wraps them) -----------------

def aten_ops_taking_generator() -> set[str]:
    """The names (without ``aten::``) of torch's operators that take a ``Generator`` argument.

    Read from torch's registry of operator schemas.
    """
    return {schema.name[len("aten::"):] for schema in torch._C._jit_get_all_schemas()
            if schema.name.startswith("aten::") and any("Generator" in str(a.type) for a in schema.arguments)}


#: Where torch's operators are Python callables (functions and methods).
OP_NAMESPACES: tuple[Any, ...] = (torch, torch.Tensor, torch._C._VariableFunctions, torch._C._nn, torch.special)


def compile_as(wrapper: Callable[..., Any], original: Callable[..., Any]) -> None:
    """Make ``torch.compile`` see ``original`` wherever it meets ``wrapper``.

    Dynamo reads torch's functions by name (``torch.rand``...) into its table
    of graph operators when it is first imported. Marked, ``wrapper`` leaves
    ``original`` in that table whether Dynamo was imported before or after
    ``wrapper`` took the name, and Dynamo traces ``original`` in its place.

    Args:
        wrapper: a Python function now bound where ``original`` was.
        original: torch's own function or method.
    """
    # The attribute torch.compile's own wrappers carry: Dynamo unwraps it in
    # its name table and when it meets the function in traced code.
    wrapper._torchdynamo_inline = original  # type: ignore[attr-defined]


def register_script_builtin(fn: Callable[..., Any], op: str) -> None:
    """Make TorchScript compile a call of ``fn`` as the operator ``op`` (``"aten::rand"``).

    Args:
        fn: a Python function standing in for one of torch's operators.
        op: the operator's qualified name.
    """
    from torch.jit import _builtins

    _builtins._register_builtin(fn, op)


def unregister_script_builtin(fn: Callable[..., Any]) -> None:
    """Undo :func:`register_script_builtin` for ``fn`` (nothing if it is not registered).

    Args:
        fn: the function registered.
    """
    from torch.jit import _builtins

    # The table is keyed by id(): a stale entry could name an unrelated object later.
    _builtins._get_builtin_table().pop(id(fn), None)


def script_builtin(fn: Callable[..., Any]) -> str | None:
    """The operator TorchScript compiles a call of ``fn`` as.

    Args:
        fn: any callable.

    Returns:
        The operator's qualified name (``"aten::rand"``), or None for a function TorchScript compiles itself.
    """
    from torch.jit import _builtins

    return _builtins._find_builtin(fn)


def pin_function_tables() -> None:
    """Build now torch's lazily built tables of its own functions.

    torch builds some sets of its functions on first use by reading
    ``torch.<name>``: the factory functions a ``torch.device`` context gives
    its device to, and the functions ``__torch_function__`` can override. A
    function mode receives torch's own functions, not what ``torch.<name>``
    holds later; built before those names are rebound, the sets hold torch's own.
    """
    _device_mod._device_constructors()
    torch.overrides._get_overridable_functions()


#: The number of torch function modes active in the calling thread.
function_mode_depth: Callable[[], int] = torch._C._len_torch_function_stack


def context_device_type() -> str | None:
    """The device type a ``torch.device(...)`` context gives the calling thread's factory calls, or None.

    ``with torch.device("cuda"):`` and ``torch.set_default_device`` push a
    function mode that adds that device to calls of ``torch.rand`` and the
    like made without one.

    Returns:
        That device's type (``"cuda"``, ``"meta"``), or None when no such mode
        is active (cheap then: one length check).
    """
    if not function_mode_depth():
        return None
    for mode in reversed(torch.overrides._get_current_function_mode_stack()):
        if isinstance(mode, _device_mod.DeviceContext):
            return mode.device.type
    return None


def top_function_mode() -> Any:
    """The innermost torch function mode active in the calling thread, or None."""
    n = function_mode_depth()
    return torch._C._get_function_stack_at(n - 1) if n else None


#: Remove and return the calling thread's innermost torch function mode.
pop_function_mode: Callable[[], Any] = torch._C._pop_torch_function_stack

#: Make a mode (one :data:`pop_function_mode` returned) the calling thread's innermost again.
push_function_mode: Callable[[Any], None] = torch._C._push_on_torch_function_stack


def autocast_devices() -> list[str]:
    """The device types autocast is on for in the calling thread (of those a worker may meet: CPU, CUDA)."""
    on = []
    for device in ("cpu", "cuda"):
        try:
            if torch.is_autocast_enabled(device):
                on.append(device)
        except (RuntimeError, TypeError):  # pragma: no cover - a device type this torch does not know
            pass
    return on


# --- DataPipes (torch.utils.data.datapipes) -------------------------------------

def datapipe_worker_copy(dataset: Any) -> Any:
    """A worker's own copy of a DataPipe dataset: the whole graph, deep-copied.

    DataLoader wraps a DataPipe in ``_IterDataPipeSerializationWrapper`` (or
    its map-style twin); a worker process gets the graph it wraps by pickling
    (or forking), so every worker has its own pipes to shard, seed and iterate
    (one iterator per pipe is all a DataPipe allows). The wrapper's own
    pickling would refuse lambdas where fork does not: the graph inside is
    deep-copied instead (functions are kept, as deepcopy keeps them).
    """
    inner = getattr(dataset, "_datapipe", None)
    if isinstance(dataset, _DATAPIPE_WRAPPERS) and inner is not None:
        return type(dataset)(copy.deepcopy(inner))
    return copy.deepcopy(dataset)


_DATAPIPE_WRAPPERS: tuple[type, ...] = (_dl._IterDataPipeSerializationWrapper, _dl._MapDataPipeSerializationWrapper)
