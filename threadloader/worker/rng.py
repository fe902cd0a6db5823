"""Per-worker routing of the global RNG API (torch, ``random``, ``numpy.random``).

Inside a DataLoader worker *process* the global RNG API is that worker's own:
``torch._worker_loop`` seeds it with ``random.seed(seed)``,
``torch.manual_seed(seed)`` and ``np.random.seed(_generate_state(base_seed, id))``
(``seed = base_seed + id``). Worker *threads* share one process, so this module
gives each worker thread its own generators, seeded the same way, and sends the
global API there while the thread is a worker:

* ``torch.manual_seed / seed / initial_seed / get_rng_state / set_rng_state``
  are Python functions: their code objects are swapped (every alias, e.g.
  ``torch.manual_seed`` and ``torch.random.manual_seed``, sees it). Outside a
  worker they run torch's original code.
* torch's operators that draw random numbers (``torch.rand``, ``torch.normal``,
  ``Tensor.uniform_``...) are replaced by Python wrappers where they are looked
  up: ``torch``, ``torch.Tensor``, ``torch.nn.functional``, ``torch._C._nn``.
  Called without a generator in a worker thread, a wrapper passes the worker's.
  Elsewhere it calls torch's own at once. Other torch calls are not touched, so
  they cost the same in every thread. ``nn.init``'s initialisers and
  ``torch.distributions`` draw through these operators, so they follow.
* ``random.<f>`` and the legacy ``numpy.random.<f>`` are bound methods of
  hidden singletons; the module attributes are replaced by functions that look
  up the calling context's instance (the singleton outside workers).

The per-worker state lives in ``contextvars`` (a thread starts with its own
context, so this is per thread); nothing global is mutated per call, and no
correctness depends on the GIL. ``ContextVar.get`` is the cheapest
per-thread lookup Python offers (cheaper than ``threading.local``).
"""

from __future__ import annotations

import contextvars
import inspect
import random as _random
import threading
from typing import Any, Callable, Iterable

import torch

from .._platform import torch_compat as _torch_compat
from .._platform.fork import renew_after_fork
from .._platform.torch_compat import numpy_seed_state

try:
    import numpy as _np
    from numpy.random import mtrand as _mtrand
except ImportError:  # pragma: no cover - numpy is a dependency
    _np = None
    _mtrand = None

__all__ = ["WorkerGenerators", "enter", "leave", "install", "uninstall", "installed", "numpy_seed_state"]


class WorkerGenerators:
    """The generators a worker thread's global RNG API acts on.

    Attributes:
        torch: CPU ``torch.Generator`` seeded with ``seed`` (torch's global API).
        random: ``random.Random(seed)`` (the ``random`` module's functions).
        numpy_legacy: ``numpy.random.RandomState`` seeded as ``np.random.seed``
            seeds a worker process (the legacy ``np.random.*`` functions).
        numpy: a NumPy ``Generator`` from the same seed state (for
            ``WorkerInfo.rng.numpy_generator``; not used by the global API).
    """

    __slots__ = ("torch", "random", "numpy_legacy", "numpy")

    def __init__(self, base_seed: int, worker_id: int) -> None:
        seed = base_seed + worker_id
        self.torch = torch.Generator()
        self.torch.manual_seed(seed)
        self.random = _random.Random(seed)
        if _np is not None:
            state = numpy_seed_state(base_seed, worker_id)
            self.numpy_legacy = _np.random.RandomState(state)
            self.numpy = _np.random.default_rng(state)
        else:  # pragma: no cover
            self.numpy_legacy = self.numpy = None


_WORKER: contextvars.ContextVar[WorkerGenerators | None] = contextvars.ContextVar(
    "threadloader_worker_rng", default=None
)
#: ``random``'s hidden singleton (the module functions' instance before routing).
PY_SINGLETON = _random._inst
_PY_RANDOM: contextvars.ContextVar[Any] = contextvars.ContextVar("threadloader_random", default=PY_SINGLETON)
#: NumPy's legacy singleton (``np.random.mtrand._rand`` before routing).
_NP_SINGLETON = _mtrand._rand if _mtrand is not None else None
_NP_LEGACY: contextvars.ContextVar[Any] = contextvars.ContextVar("threadloader_numpy_random", default=_NP_SINGLETON)
#: This module's context variables: each worker thread sets its own, never inherits them.
CONTEXT_VARS = frozenset({_WORKER, _PY_RANDOM, _NP_LEGACY})


if _np is not None:
    class _RoutedRandomState(_np.random.RandomState):
        """``np.random.mtrand._rand`` while routing is installed: the calling context's legacy state.

        scikit-learn's and SciPy's ``check_random_state(None)`` return that
        singleton and draw through its methods, not the module functions; in
        a worker thread they must reach the worker's ``RandomState``, as they
        reach the worker process's own singleton under DataLoader. A subclass,
        so ``isinstance`` checks hold; every attribute is the current one's.
        """

        def __getattribute__(self, name: str) -> Any:
            return getattr(_NP_LEGACY.get(), name)

        def __setattr__(self, name: str, value: Any) -> None:
            setattr(_NP_LEGACY.get(), name, value)


def is_numpy_generator(value: Any) -> bool:
    """Whether ``value`` is a NumPy ``Generator`` or a ``RandomState`` of its own (not the legacy singleton)."""
    if _np is None or not isinstance(value, (_np.random.Generator, _np.random.RandomState)):
        return False
    # The singleton and its router (their type first: the router forwards attributes).
    return type(value) is not _RoutedRandomState and value is not _NP_SINGLETON


# --- torch's random operators ------------------------------------------------------

def _operators_taking_generator() -> frozenset:
    """Every torch operator that accepts ``generator=`` (Python functions such as ``nn.init``'s pass theirs on to these)."""
    found = set()
    # Generator methods, not samplers.
    for name in _torch_compat.aten_ops_taking_generator() - {"manual_seed", "seed", "initial_seed"}:
        for ns in _torch_compat.OP_NAMESPACES:
            fn = getattr(ns, name, None)
            if callable(fn):
                found.add(fn)
    return frozenset(found)


#: Modules whose attributes are torch's operators, with the name pickle finds them under.
_OP_MODULES: tuple[tuple[Any, str], ...] = (
    (torch, "torch"),
    (torch.special, "torch.special"),
    (torch.nn.functional, "torch.nn.functional"),
    (torch._C._nn, "torch._C._nn"),
)


def _op_sites(ops: Iterable[Any]) -> list[tuple[Any, str, str, str]]:
    """Where the operators in ``ops`` are looked up.

    Module attributes that are the operator itself, and ``torch.Tensor``'s
    attribute for methods (inherited from ``TensorBase``; set on
    ``torch.Tensor`` it shadows that for every tensor class).

    Args:
        ops: operators, as :func:`_operators_taking_generator` lists them.

    Returns:
        ``(namespace, attribute, module, qualname)`` per site, ``module`` and
        ``qualname`` naming the site as pickle finds it (``torch``, ``Tensor.uniform_``).
    """
    sites = []
    for fn in ops:
        name = getattr(fn, "__name__", None)
        if name is None:
            continue
        if getattr(torch.Tensor, name, None) is fn:
            sites.append((torch.Tensor, name, "torch", "Tensor." + name))
            continue
        for ns, module in _OP_MODULES:
            if vars(ns).get(name) is fn:
                sites.append((ns, name, module, name))
    sites.sort(key=lambda site: (site[2], site[3]))
    return sites


_Tensor = torch.Tensor
_Generator = torch.Generator
#: Argument types that are neither tensors nor generators (sizes, bounds): skipped at once.
_PLAIN = frozenset({int, float, bool, tuple, list, torch.Size})


def _with_generator(generator: torch.Generator, args: tuple, kwargs: dict) -> dict:
    """``kwargs`` with ``generator`` added where the call would draw from the CPU's global generator.

    ``kwargs`` is the wrapper's own dict: it is changed in place and returned.

    Left alone: a call given a generator (by keyword or by position, as
    ``torch.poisson`` takes it), a device other than the CPU, a tensor off the
    CPU (by position or by keyword: ``torch.normal(mean=cuda_tensor, std=1.)``)
    without a device, and a factory call under ``with torch.device("cuda")``.
    There the draw runs on another device, where a CPU generator is an error.
    """
    device = None
    if kwargs:
        if kwargs.get("generator") is not None:
            return kwargs
        device = kwargs.get("device")
    tensors = False
    # Plain loops and type lookups first: this runs on every random op of a worker.
    for arg in args:
        kind = type(arg)
        if kind in _PLAIN:
            continue
        if kind is _Generator:
            return kwargs
        if isinstance(arg, _Tensor):
            if device is None and not arg.is_cpu:
                return kwargs
            tensors = True
    if device is not None:
        if torch.device(device).type != "cpu":
            return kwargs  # CUDA draws stay on the device's global generator
    else:
        if kwargs:
            for value in kwargs.values():
                if isinstance(value, _Tensor):
                    if not value.is_cpu:
                        return kwargs
                    tensors = True
        if not tensors and _torch_compat.context_device_type() not in (None, "cpu"):
            return kwargs  # the device context gives the factory call its device
    kwargs["generator"] = generator
    return kwargs


#: False when called, True while torch.compile traces the call (Dynamo folds it).
_dynamo_compiling = torch.compiler.is_dynamo_compiling


def _routing(original: Callable, name: str, module: str, qualname: str) -> Callable:
    """A function that calls ``original``, with the worker's generator where a worker thread gave none.

    Args:
        original: torch's operator (function or ``TensorBase`` method).
        name: its name.
        module: the module the wrapper is bound in (``torch``), for pickle.
        qualname: its path there (``rand``, ``Tensor.uniform_``), for pickle.

    Returns:
        The wrapper.
    """
    compiling = _dynamo_compiling
    current = _WORKER.get

    def routed(*args, **kwargs):
        # torch.compile traces ``original`` in the wrapper's place (compile_as);
        # were it to trace the wrapper, this keeps torch's operator in the graph.
        if compiling():
            return original(*args, **kwargs)
        # Reads a context variable, writes nothing shared: thread-safe without the GIL.
        gens = current()
        if gens is None:
            return original(*args, **kwargs)
        return original(*args, **_with_generator(gens.torch, args, kwargs))

    routed.__name__ = name
    routed.__qualname__ = qualname
    routed.__module__ = module
    routed.__doc__ = getattr(original, "__doc__", None)
    routed.__wrapped__ = original
    _torch_compat.compile_as(routed, original)
    return routed


# --- torch.random's Python functions (their code runs with torch.random's globals) ----

# pragma: no cover on the bodies: they run as torch's functions (coverage misses them).
def _manual_seed(seed):  # pragma: no cover
    gens = _threadloader_worker_rng()  # noqa: F821
    if gens is None:
        return _threadloader_torch_originals["manual_seed"](seed)  # noqa: F821
    return gens.torch.manual_seed(int(seed))


def _seed():  # pragma: no cover
    gens = _threadloader_worker_rng()  # noqa: F821
    if gens is None:
        return _threadloader_torch_originals["seed"]()  # noqa: F821
    return gens.torch.seed()


def _initial_seed():  # pragma: no cover
    gens = _threadloader_worker_rng()  # noqa: F821
    if gens is None:
        return _threadloader_torch_originals["initial_seed"]()  # noqa: F821
    return gens.torch.initial_seed()


def _get_rng_state():  # pragma: no cover
    gens = _threadloader_worker_rng()  # noqa: F821
    if gens is None:
        return _threadloader_torch_originals["get_rng_state"]()  # noqa: F821
    return gens.torch.get_state()


def _set_rng_state(new_state):  # pragma: no cover
    gens = _threadloader_worker_rng()  # noqa: F821
    if gens is None:
        return _threadloader_torch_originals["set_rng_state"](new_state)  # noqa: F821
    return gens.torch.set_state(new_state)


_TORCH_SWAPS: dict[str, Callable] = {
    "manual_seed": _manual_seed,
    "seed": _seed,
    "initial_seed": _initial_seed,
    "get_rng_state": _get_rng_state,
    "set_rng_state": _set_rng_state,
}


# --- random / numpy.random module functions --------------------------------------

def _forwarder(module_name: str, name: str, original: Callable, get: Callable[[], Any], exact: bool) -> Callable:
    """A function ``name`` that calls ``get().name(...)``.

    With ``exact`` the wrapper has the original's own signature (fastest: no
    ``*args``/``**kwargs`` packing); its defaults are the original's objects,
    so passing them on explicitly changes nothing.
    """
    params = None
    if exact:
        try:
            params = list(inspect.signature(original).parameters.values())
        except (TypeError, ValueError):
            params = None
    P = inspect.Parameter
    if params is None:
        header, call, defaults, kwdefaults = "*args, **kwargs", "*args, **kwargs", None, None
    else:
        head, passed, defaults, kwdefaults = [], [], [], {}
        seen_pos_only = seen_kw_only = False
        for p in params:
            if p.kind is P.POSITIONAL_ONLY:
                seen_pos_only = True
            elif seen_pos_only:
                head.append("/")
                seen_pos_only = False
            if p.kind is P.VAR_POSITIONAL:
                head.append("*" + p.name)
                passed.append("*" + p.name)
                seen_kw_only = True
                continue
            if p.kind is P.VAR_KEYWORD:
                head.append("**" + p.name)
                passed.append("**" + p.name)
                continue
            if p.kind is P.KEYWORD_ONLY:
                if not seen_kw_only:
                    head.append("*")
                    seen_kw_only = True
                if p.default is not P.empty:
                    kwdefaults[p.name] = p.default
                head.append(p.name)
                passed.append(f"{p.name}={p.name}")
                continue
            if p.default is not P.empty:
                defaults.append(p.default)
            head.append(p.name)
            passed.append(p.name)
        if seen_pos_only:
            head.append("/")
        header, call = ", ".join(head), ", ".join(passed)
        defaults = tuple(defaults) or None
        kwdefaults = kwdefaults or None
    namespace: dict[str, Any] = {"_get": get}
    exec(f"def {name}({header}):\n    return _get().{name}({call})\n", namespace)  # noqa: S102
    fn = namespace[name]
    fn.__defaults__ = defaults
    fn.__kwdefaults__ = kwdefaults
    fn.__module__ = module_name
    fn.__qualname__ = name
    fn.__doc__ = getattr(original, "__doc__", None)
    fn.__wrapped__ = original
    return fn


def _numpy_special(name: str, original: Callable) -> Callable:
    """numpy.random module functions that are not bound methods of the singleton."""
    get = _NP_LEGACY.get
    default = _NP_LEGACY.get()

    if name in ("ranf", "sample"):  # aliases of random_sample
        def fn(*args, **kwargs):
            r = get()
            return original(*args, **kwargs) if r is default else r.random_sample(*args, **kwargs)
    elif name == "seed":
        def fn(seed=None):
            r = get()
            if r is default:
                return original(seed)
            # As numpy's module function: a bit generator other than MT19937
            # (set_bit_generator) is reseeded through its own type.
            bitgen = r._bit_generator
            if isinstance(bitgen, _np.random.MT19937):
                return r.seed(seed)
            bitgen.state = type(bitgen)(seed).state
    elif name == "get_bit_generator":
        def fn():
            r = get()
            return original() if r is default else r._bit_generator
    elif name == "set_bit_generator":
        def fn(bitgen):
            r = get()
            if r is default:
                # The singleton's, as numpy's function sets it (a RandomState
                # built on ``bitgen``). Not numpy's function itself: it acts on
                # whatever ``mtrand._rand`` is, which is the router while
                # routing is installed.
                default.__init__(bitgen)
                return None
            # A worker's own legacy state, as set_bit_generator sets the
            # process's in a worker process.
            _NP_LEGACY.set(_np.random.RandomState(bitgen))
            return None
    else:  # pragma: no cover
        raise AssertionError(name)
    fn.__name__ = fn.__qualname__ = name
    fn.__module__ = "numpy.random.mtrand"
    fn.__doc__ = getattr(original, "__doc__", None)
    fn.__wrapped__ = original
    return fn


# --- install / uninstall ----------------------------------------------------------

_lock = threading.Lock()
renew_after_fork(__name__, "_lock")
_installed = False
#: (namespace, attribute, original) for every replaced module attribute.
_replaced: list[tuple[Any, str, Any]] = []
#: (namespace, attribute, whether the namespace had the attribute itself, original, wrapper) per operator.
_wrapped_ops: list[tuple[Any, str, bool, Any, Callable]] = []
_torch_code: dict[str, Any] = {}
#: Functions :func:`uninstall` took out, kept alive: torch.compile keeps tables keyed by id()
#: (NumPy's functions, read while ours stood in for them), and a new object must not take such an id.
_retired: list[Callable] = []


def installed() -> bool:
    """Whether the global RNG API is routed (threadloader installs it on import)."""
    return _installed


def _swap_torch_functions() -> None:
    mod = torch.random
    originals = {}
    for name, replacement in _TORCH_SWAPS.items():
        target = getattr(mod, name)
        code = target.__code__
        want = list(inspect.signature(replacement).parameters)
        have = list(inspect.signature(target).parameters)
        if code.co_freevars or want != have:
            raise RuntimeError(
                f"threadloader: torch.random.{name} has an unexpected form in this torch version "
                f"(parameters {have}); threadloader's RNG adapter needs updating"
            )
        # A copy of torch's function, called outside workers.
        originals[name] = type(target)(code, target.__globals__, name, target.__defaults__, None)
        _torch_code[name] = code
    mod._threadloader_torch_originals = originals
    mod._threadloader_worker_rng = _WORKER.get
    for name, replacement in _TORCH_SWAPS.items():
        getattr(mod, name).__code__ = replacement.__code__


def _wrap_random_ops() -> None:
    """Bind a routing wrapper at every place torch's random operators are looked up."""
    # Before the names change: torch's tables read them once, and must keep its own functions.
    _torch_compat.pin_function_tables()
    for ns, name, module, qualname in _op_sites(_operators_taking_generator()):
        own = name in vars(ns)
        original = getattr(ns, name)
        wrapper = _routing(original, name, module, qualname)
        if ns is not torch.Tensor:
            # TorchScript compiles torch's functions by identity: the wrapper is
            # the same operator (its original stays registered for uninstall).
            op = _torch_compat.script_builtin(original) or "aten::" + name
            _torch_compat.register_script_builtin(original, op)
            _torch_compat.register_script_builtin(wrapper, op)
        _wrapped_ops.append((ns, name, own, original, wrapper))
        setattr(ns, name, wrapper)


def _unwrap_random_ops() -> None:
    """Put back what :func:`_wrap_random_ops` replaced, exactly as it was."""
    while _wrapped_ops:
        ns, name, own, original, wrapper = _wrapped_ops.pop()
        if own:
            setattr(ns, name, original)
        else:
            delattr(ns, name)  # inherited again (torch.Tensor from TensorBase)
        _torch_compat.unregister_script_builtin(wrapper)
        _retired.append(wrapper)


def _replace_module_functions() -> None:
    inst = PY_SINGLETON
    for name in dir(_random):
        value = getattr(_random, name)
        if getattr(value, "__self__", None) is inst:
            fn = _forwarder("random", name, value, _PY_RANDOM.get, exact=True)
            _replaced.append((_random, name, value))
            setattr(_random, name, fn)
    if _np is None:  # pragma: no cover
        return
    rand = _NP_SINGLETON
    special = ("seed", "ranf", "sample", "get_bit_generator", "set_bit_generator")
    made: dict[str, Callable] = {}
    for ns in (_np.random, _mtrand):
        for name in dir(ns):
            if name.startswith("_"):
                continue
            value = getattr(ns, name)
            if getattr(value, "__self__", None) is rand:
                fn = made.get(name) or _forwarder("numpy.random.mtrand", name, value, _NP_LEGACY.get, exact=False)
            elif name in special and callable(value):
                fn = made.get(name) or _numpy_special(name, value)
            else:
                continue
            made[name] = fn
            _replaced.append((ns, name, value))
            setattr(ns, name, fn)
    _replaced.append((_mtrand, "_rand", rand))
    _mtrand._rand = _RoutedRandomState()


def install() -> None:
    """Route the global RNG API of worker threads to their own generators (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        _swap_torch_functions()
        _replace_module_functions()
        _wrap_random_ops()
        _installed = True


def uninstall() -> None:
    """Undo :func:`install` (for benchmarks and tests; no worker may be running)."""
    global _installed
    with _lock:
        if not _installed:
            return
        for name, code in _torch_code.items():
            getattr(torch.random, name).__code__ = code
        _torch_code.clear()
        _unwrap_random_ops()
        while _replaced:
            ns, name, value = _replaced.pop()
            _retired.append(getattr(ns, name))
            setattr(ns, name, value)
        _installed = False


# --- worker threads --------------------------------------------------------------

def enter(gens: WorkerGenerators) -> None:
    """Make the calling thread's global RNG API act on ``gens`` until :func:`leave`."""
    _WORKER.set(gens)
    _PY_RANDOM.set(gens.random)
    if gens.numpy_legacy is not None:
        _NP_LEGACY.set(gens.numpy_legacy)


def leave() -> None:
    """Give the calling thread the process-wide RNG API back."""
    if _WORKER.get() is None:
        return
    _WORKER.set(None)
    _PY_RANDOM.set(PY_SINGLETON)
    if _mtrand is not None:
        _NP_LEGACY.set(_NP_SINGLETON)


def calling_generators() -> tuple[Any, torch.Generator, Any]:
    """The generators the calling thread's global RNG API acts on: ``random``'s, torch's, legacy NumPy's.

    A worker thread's own (:func:`enter`), or else the process's: those of a
    worker that is its process's only one, and of any thread outside workers.
    """
    gens = _WORKER.get()
    if gens is not None:
        return gens.random, gens.torch, gens.numpy_legacy
    return _PY_RANDOM.get(), torch.default_generator, _NP_LEGACY.get()
