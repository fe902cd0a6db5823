"""What a worker thread adds to each torch call: the same small op timed in a plain thread and in a worker thread."""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any, NamedTuple

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["TorchCallCost", "torch_call_cost"]


class TorchCallCost(NamedTuple):
    """Nanoseconds per call of ``x.add(1)`` on an 8-element tensor (median of interleaved rounds)."""

    plain_ns: float
    worker_ns: float
    #: The same under a torch function mode that only calls the function: what any Python mode costs.
    bare_mode_ns: float

    @property
    def added_ns(self) -> float:
        """What the worker thread adds per torch call."""
        return self.worker_ns - self.plain_ns

    def line(self) -> str:
        """One line for the report."""
        return (f"per torch call (x.add(1)): plain thread {self.plain_ns:.0f} ns, worker thread "
                f"{self.worker_ns:.0f} ns: {self.added_ns:+.0f} ns added by a worker thread "
                f"(a torch function mode that does nothing adds {self.bare_mode_ns - self.plain_ns:+.0f} ns)")


class _BareMode(TorchFunctionMode):
    """Calls every function as it is: the cost of torch's Python mode dispatch alone."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if kwargs:
            return func(*args, **kwargs)
        return func(*args)


def _time_calls(calls: int) -> float:
    x = torch.zeros(8)
    start = time.perf_counter()
    for _ in range(calls):
        x.add(1)
    return (time.perf_counter() - start) / calls * 1e9


def torch_call_cost(calls: int = 20_000, rounds: int = 5) -> TorchCallCost:
    """Time ``x.add(1)`` in a plain thread and in a worker thread (``enter_worker``), rounds interleaved.

    Args:
        calls: calls per timing.
        rounds: interleaved rounds; the median of each side is kept.

    Returns:
        A :class:`TorchCallCost`.
    """
    from threadloader import worker

    times: dict[str, list[float]] = {"plain": [], "worker": [], "bare": []}

    def body() -> None:
        for _ in range(rounds):
            times["plain"].append(_time_calls(calls))
            with _BareMode():
                times["bare"].append(_time_calls(calls))
            worker.enter_worker(0, 1, 0, None)
            try:
                times["worker"].append(_time_calls(calls))
            finally:
                worker.leave_worker()

    # One thread for both sides: the same thread-local torch state, only the worker's entry differs.
    t = threading.Thread(target=body, name="threadloader-bench-torch-call")
    t.start()
    t.join()
    return TorchCallCost(*(statistics.median(times[k]) for k in ("plain", "worker", "bare")))
