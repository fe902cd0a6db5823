"""Datasets and utilities shared by the loader tests."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import random
import re
import signal
import threading
import time
from multiprocessing import forkserver, resource_tracker
from types import ModuleType
from typing import Any, Callable, Iterator

import numpy as np
import psutil
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info


class Squares(Dataset):
    """A map-style dataset returning (i, i*i as a tensor)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return i, torch.tensor([i * i], dtype=torch.int64)


class Failing(Dataset):
    """Raises ``exc`` for the indices in ``bad``."""

    def __init__(self, n: int, bad: set[int], exc: type[Exception] = ValueError) -> None:
        self.n, self.bad, self.exc = n, bad, exc

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i in self.bad:
            raise self.exc(f"bad sample {i}")
        return i


class DiesAt(Dataset):
    """Map-style: ``i`` everywhere but at ``bad``, where a BaseException ends the worker."""

    def __init__(self, exc: BaseException, bad: int = 2, n: int = 6, delay: float = 0.0) -> None:
        self.exc, self.bad, self.n, self.delay = exc, bad, n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i == self.bad:
            time.sleep(self.delay)
            raise self.exc
        return i


class OwnGenerators(Dataset):
    """Augments with generators of its own, made once in __init__ (a common pattern)."""

    def __init__(self):
        self.np_rng = np.random.default_rng(0)
        self.legacy = np.random.RandomState(1)
        self.py_rng = random.Random(2)
        self.torch_rng = torch.Generator().manual_seed(3)

    def __len__(self):
        return 16

    def __getitem__(self, i):
        time.sleep(0.001 * (i % 3))  # workers interleave differently on every run
        return (i, float(self.np_rng.random()), float(self.legacy.rand()), self.py_rng.random(),
                torch.rand((), generator=self.torch_rng).item())


class DictProxy:
    """A ``__getattr__`` that answers from a dict: a KeyError, not an AttributeError, for other names."""

    def __getattr__(self, name):
        return self.__dict__["cfg"][name]


class NoStateSampler(torch.utils.data.Sampler):
    """``range(n)`` in order; its ``state_dict()`` raises (not ready, unsupported...): DataLoader never calls it."""

    def __init__(self, n: int, error: Exception | None = None) -> None:
        self.n = n
        self.error = error if error is not None else NotImplementedError("no state yet")

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(range(self.n))

    def state_dict(self):
        raise self.error

    def load_state_dict(self, state) -> None:
        pass


class Slow(Dataset):
    def __init__(self, n: int, delay: float, slow: set[int] | None = None) -> None:
        self.n, self.delay, self.slow = n, delay, slow

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if self.slow is None or i in self.slow:
            time.sleep(self.delay)
        return i


class Sharded(IterableDataset):
    """An IterableDataset that shards itself with get_worker_info()."""

    def __init__(self, start: int, end: int, uneven: bool = False) -> None:
        self.start, self.end, self.uneven = start, end, uneven

    def __iter__(self):
        info = get_worker_info()
        if info is None:
            lo, hi, step = self.start, self.end, 1
            return iter(range(lo, hi, step))
        if self.uneven:  # worker k yields k * 3 + 1 items
            base = self.start + 100 * info.id
            return iter(range(base, base + info.id * 3 + 1))
        return iter(range(self.start + info.id, self.end, info.num_workers))


class Recorder(Dataset):
    """Records the worker info and thread seen for each index."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.lock = threading.Lock()
        self.seen: dict[int, tuple] = {}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        info = get_worker_info()
        with self.lock:
            self.seen[i] = (info, threading.get_ident(), worker_torch_generator())
        return i


def worker_torch_generator() -> torch.Generator | None:
    """The calling worker thread's torch generator, as torch exposes it.

    ``torch.random.thread_safe_generator()`` from torch 2.12 on; torch 2.11 has
    no such function, and the worker info's ``rng`` holds the same generator.
    """
    public = getattr(torch.random, "thread_safe_generator", None)
    if public is not None:
        return public()
    info = get_worker_info()
    return None if info is None else info.rng.torch_generator


def to_list(batches):
    """Turn a sequence of batches into nested Python lists for comparison."""

    def conv(x):
        if isinstance(x, torch.Tensor):
            return x.tolist()
        if isinstance(x, (list, tuple)):
            return [conv(v) for v in x]
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items()}
        return x

    return [conv(b) for b in batches]


def require_torchvision(submodule: str = "") -> ModuleType:
    """Import torchvision (or ``torchvision.<submodule>``), or skip the test or module that needs it.

    torchvision is not a dependency of the library. It may be missing, or be
    installed but fail to import beside this torch (a wheel built for another
    torch version raises RuntimeError or OSError, not only ImportError).
    """
    name = "torchvision" + (f".{submodule}" if submodule else "")
    try:
        return importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - any import failure means "not usable here"
        pytest.skip(f"{name} unavailable: {type(e).__name__}: {e}", allow_module_level=True)


@contextlib.contextmanager
def no_sigchld_handler():
    """DataLoader without its SIGCHLD handler, restored after.

    The handler raises in the main thread whenever a worker process dies: between
    two ``next()`` calls, or inside one after a batch was taken off the queue, which
    then is lost and the death reported twice (seen on torch 2.13). DataLoader's
    status check (every 5 s) reports the death the same way on every run.
    """
    from torch.utils.data._utils import signal_handling

    was_set, previous = signal_handling._SIGCHLD_handler_set, signal.getsignal(signal.SIGCHLD)
    signal_handling._SIGCHLD_handler_set = True  # DataLoader installs nothing
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGCHLD, previous)
        signal_handling._SIGCHLD_handler_set = was_set


def outcomes(loader, limit: int = 12, death: str = "exited unexpectedly") -> list:
    """Each ``next()``'s result, or "exited" for a worker's death, until StopIteration (a hang fails by timeout).

    Args:
        death: a pattern (``re.search``) every death's message must match.
    """
    out, it = [], iter(loader)
    while len(out) < limit:
        try:
            out.append(int(next(it)))
        except StopIteration:
            return out + ["StopIteration"]
        except RuntimeError as e:
            assert re.search(death, str(e)), e
            out.append("exited")
    return out


@contextlib.contextmanager
def held_by_another_thread(*locks: Any) -> Iterator[None]:
    """Within this block another thread holds ``locks`` (to fork while they are held)."""
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with contextlib.ExitStack() as stack:
            for lock in locks:
                stack.enter_context(lock)
            held.set()
            done.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    try:
        yield
    finally:
        done.set()
        holder.join()


# --- nothing left behind: processes, threads, file descriptors, shared memory -------------

def child_processes() -> list[psutil.Process]:
    """This process's live descendants, but multiprocessing's own helpers."""
    # multiprocessing's resource tracker (started once by the spawn start
    # method, for the whole session) and its forkserver are not worker processes.
    helpers = {getattr(resource_tracker._resource_tracker, "_pid", None),
               getattr(forkserver._forkserver, "_forkserver_pid", None)}
    return [p for p in psutil.Process().children(recursive=True)
            if p.status() != psutil.STATUS_ZOMBIE and p.pid not in helpers]


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def shm_entries() -> set[str]:
    """This process's shared-memory entries: named after it, or still mapped by it.

    /dev/shm is machine-wide and other processes' semaphores come and go in
    it, so only what can be ours is looked at: torch's segments carry the pid
    of their creator, and a segment or semaphore we still use is in our maps.
    """
    names = {n for n in (os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else [])
             if f"_{os.getpid()}_" in n}
    with open("/proc/self/maps") as maps:
        mapped = {line.split(None, 5)[-1].strip() for line in maps if "/dev/shm/" in line}
    return names | mapped


def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Whether ``cond()`` became true within ``timeout`` seconds (polled)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


# --- execution modes and the DataLoader oracle (tests/test_contract.py) -------------------

@dataclasses.dataclass(frozen=True)
class Mode:
    """One way a ThreadDataLoader runs its workers: the constructor arguments that choose it.

    A new mode (an adaptive one, say) is one more entry of :data:`MODES`.
    """

    name: str
    #: Extra ThreadDataLoader arguments, given how many worker processes a test asks for.
    extra: Callable[[int], dict[str, Any]]
    #: Whether its workers run in child processes.
    in_children: bool = False
    #: Environment variables the mode needs while a test runs (the ``mode`` fixture sets them).
    env: dict[str, str] = dataclasses.field(default_factory=dict)

    def kwargs(self, processes: int = 2) -> dict[str, Any]:
        """The arguments that select this mode (``processes``: where it has worker processes)."""
        return self.extra(processes)

    def __str__(self) -> str:
        return self.name


MODES: tuple[Mode, ...] = (
    Mode("threads", lambda processes: dict(worker_processes=0)),
    Mode("processes", lambda processes: dict(worker_processes=processes, multiprocessing_context="fork"),
         in_children=True),
    # The default, made to move its threads into processes after the first batch.
    Mode("adaptive", lambda processes: dict(multiprocessing_context="fork"), env={"THREADLOADER_MOVE_AFTER": "1"}),
    # The default, made to move its threads into the consumer's thread after the first batch.
    Mode("inline", lambda processes: {}, env={"THREADLOADER_INLINE_AFTER": "1"}),
)


def assert_same_as_dataloader(dataset: Any, mode: Mode, *, epochs: int = 1, seed: int = 0, processes: int = 2,
                              oracle: dict[str, Any] | None = None, check_rng: bool = True,
                              **kwargs: Any) -> list[list[Any]]:
    """Assert that a ThreadDataLoader in ``mode`` yields DataLoader's batches, epoch after epoch.

    Both loaders are built with ``kwargs`` (DataLoader also with ``oracle``,
    and the fork start method when it has workers) from the same global seed,
    and iterated ``epochs`` times. ``check_rng=False`` where ``oracle`` makes
    DataLoader draw differently (a new iterator per epoch draws a new base seed).

    Returns:
        The batches of each epoch, as nested lists.

    Raises:
        AssertionError: different batches, or the global RNG left in a different state.
    """

    def run(cls: type, **kw: Any) -> tuple[list[list[Any]], torch.Tensor]:
        torch.manual_seed(seed)
        loader = cls(dataset, **kw)
        batches = [to_list(loader) for _ in range(epochs)]
        return batches, torch.get_rng_state()

    oracle_kwargs = {**kwargs, **(oracle or {})}
    if oracle_kwargs.get("num_workers"):
        oracle_kwargs.setdefault("multiprocessing_context", "fork")
    expected, expected_rng = run(torch.utils.data.DataLoader, **oracle_kwargs)
    from threadloader import ThreadDataLoader

    got, got_rng = run(ThreadDataLoader, **kwargs, **mode.kwargs(processes))
    assert got == expected, f"{mode}: not DataLoader's batches"
    if check_rng:
        assert torch.equal(got_rng, expected_rng), f"{mode}: the global RNG consumed differently from DataLoader"
    return got
