"""What a worker thread adds to each torch call: the same small ops timed in a plain thread and in a worker thread."""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any, Callable, NamedTuple

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["TorchCallCost", "torch_call_cost"]


class TorchCallCost(NamedTuple):
    """Nanoseconds per call on an 8-element tensor (median of interleaved rounds).

    ``x.add(1)`` stands for the torch calls that draw nothing, ``torch.rand(8)``
    for those that draw from the global generator (the worker's own in a worker thread).
    """

    plain_ns: float
    worker_ns: float
    #: ``x.add(1)`` under a torch function mode that only calls the function: what any Python mode costs.
    bare_mode_ns: float
    #: ``torch.rand(8)`` in a plain thread.
    rand_plain_ns: float
    #: ``torch.rand(8)`` in a worker thread (drawn from the worker's generator).
    rand_worker_ns: float

    @property
    def added_ns(self) -> float:
        """What the worker thread adds per torch call that draws nothing."""
        return self.worker_ns - self.plain_ns

    @property
    def rand_added_ns(self) -> float:
        """What the worker thread adds per random op (passing the worker's generator)."""
        return self.rand_worker_ns - self.rand_plain_ns

    def line(self) -> str:
        """One line for the report."""
        return (f"per torch call (x.add(1)): plain thread {self.plain_ns:.0f} ns, worker thread "
                f"{self.worker_ns:.0f} ns: {self.added_ns:+.0f} ns added by a worker thread "
                f"(a torch function mode that does nothing adds {self.bare_mode_ns - self.plain_ns:+.0f} ns); "
                f"per random op (torch.rand(8)): plain thread {self.rand_plain_ns:.0f} ns, worker thread "
                f"{self.rand_worker_ns:.0f} ns: {self.rand_added_ns:+.0f} ns to draw from the worker's generator")


class _BareMode(TorchFunctionMode):
    """Calls every function as it is: the cost of torch's Python mode dispatch alone."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if kwargs:
            return func(*args, **kwargs)
        return func(*args)


def _time_add(calls: int) -> float:
    x = torch.zeros(8)
    start = time.perf_counter()
    for _ in range(calls):
        x.add(1)
    return (time.perf_counter() - start) / calls * 1e9


def _time_rand(calls: int) -> float:
    # torch.rand is looked up on each call, as user code does.
    start = time.perf_counter()
    for _ in range(calls):
        torch.rand(8)
    return (time.perf_counter() - start) / calls * 1e9


def torch_call_cost(calls: int = 20_000, rounds: int = 5) -> TorchCallCost:
    """Time ``x.add(1)`` and ``torch.rand(8)`` in a plain thread and in a worker thread (``enter_worker``).

    Rounds are interleaved, so machine noise falls on every side alike.

    Args:
        calls: calls per timing.
        rounds: interleaved rounds; the median of each side is kept.

    Returns:
        A :class:`TorchCallCost`.
    """
    from threadloader import worker

    times: dict[str, list[float]] = {k: [] for k in ("plain", "worker", "bare", "rand_plain", "rand_worker")}

    def timed(key: str, fn: Callable[[int], float]) -> None:
        times[key].append(fn(calls))

    def body() -> None:
        for _ in range(rounds):
            timed("plain", _time_add)
            timed("rand_plain", _time_rand)
            with _BareMode():
                timed("bare", _time_add)
            worker.enter_worker(0, 1, 0, None)
            try:
                timed("worker", _time_add)
                timed("rand_worker", _time_rand)
            finally:
                worker.leave_worker()

    # One thread for every side: the same thread-local torch state, only the worker's entry differs.
    t = threading.Thread(target=body, name="threadloader-bench-torch-call")
    t.start()
    t.join()
    return TorchCallCost(*(statistics.median(times[k]) for k in ("plain", "worker", "bare", "rand_plain",
                                                                   "rand_worker")))
