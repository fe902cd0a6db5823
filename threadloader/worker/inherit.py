"""What a worker thread inherits from the thread that started it.

A worker process that DataLoader forks starts as a copy of the thread that
called ``iter()``: inside ``torch.no_grad()`` or ``torch.inference_mode()``,
under ``np.errstate(...)``, with a ``decimal.localcontext()``, its workers run
the dataset that way. A new thread starts with none of it (torch's grad and
inference modes are per thread, and so are ``contextvars``, where NumPy 2 keeps
its error state and ``decimal`` its context). :func:`capture` takes that state
in the starting thread and :func:`run_inheriting` sets it up in the new one.

Carried: torch's grad mode, the ``contextvars`` (a ``decimal`` context as a
copy: that object is mutable and each process has its own), NumPy's error
state (a context variable in NumPy 2, thread-local in NumPy 1: set either way).

Inference mode is carried as grad mode off. The tensors a worker thread makes
reach the training loop as they are (a worker process's are rebuilt there).
Inference tensors would refuse to be saved for backward if a persistent worker
started under ``inference_mode`` served a training epoch.

Not carried: autocast and torch function modes (``torch.device(...)`` as a
context manager); docs/differences.md lists them among the differences.
threadloader's own context variables (the per-worker random routing) are never
inherited: each worker sets its own.
"""

from __future__ import annotations

import contextvars
import sys
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from .._platform import torch_compat as _torch_compat
from . import context as _context
from . import rng as _rng

__all__ = ["CallerState", "capture", "new_context", "run_inheriting"]


@dataclass(frozen=True)
class CallerState:
    """The starting thread's state, as :func:`capture` took it."""

    grad_enabled: bool
    context: tuple[tuple[contextvars.ContextVar[Any], Any], ...]
    numpy_errors: dict[str, str]


def capture() -> CallerState:
    """The calling thread's state, for the threads it is about to start."""
    own = _rng.CONTEXT_VARS | _torch_compat.CONTEXT_VARS | _context.CONTEXT_VARS
    context = tuple((var, value) for var, value in contextvars.copy_context().items() if var not in own)
    # Inference mode turns grad mode off too: is_grad_enabled() is False in it.
    return CallerState(torch.is_grad_enabled(), context, np.geterr())


def run_inheriting(state: CallerState, target: Callable[..., Any], *args: Any) -> Any:
    """Run ``target(*args)`` in this (new) thread with ``state`` set up first.

    Returns:
        What ``target`` returned.
    """
    _set_context(state)
    np.seterr(**state.numpy_errors)
    torch.set_grad_enabled(state.grad_enabled)  # a per-thread setting: for this thread's lifetime
    return target(*args)


def _set_context(state: CallerState) -> None:
    """Set the starting thread's context variables in the current context."""
    decimal = sys.modules.get("decimal")
    for var, value in state.context:
        if decimal is not None and isinstance(value, decimal.Context):
            value = value.copy()  # flags and precision set here must not reach the starting thread
        var.set(value)


def new_context(state: CallerState) -> contextvars.Context:
    """A context with the starting thread's context variables, for a worker run in that thread's own.

    NumPy 2 keeps its error state there, so it is carried; NumPy 1 keeps it
    per thread, so it is not. Grad mode is per thread: whoever runs the
    worker's tasks in the context sets ``state.grad_enabled`` around each.
    """
    context = contextvars.Context()  # empty, as a new thread's
    context.run(_set_context, state)
    if _NUMPY_ERRORS_IN_CONTEXT:
        context.run(np.seterr, **state.numpy_errors)
    return context


#: NumPy 2 keeps its error state in a context variable (NumPy 1 per thread).
_NUMPY_ERRORS_IN_CONTEXT = int(np.__version__.split(".")[0]) >= 2
