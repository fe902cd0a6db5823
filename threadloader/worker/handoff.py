"""What a worker hands over to go on in another thread or process: :class:`WorkerHandoff`.

The adaptive mode moves a loader's workers from threads of its process into
child processes in the middle of an epoch. A DataLoader worker is set up once
(``worker_init_fn``, seeds) and then draws from its own random streams, so a
moved worker must go on exactly where it stopped: its copies of the dataset
and hooks as they are, and its generators' states. Each worker captures its
own while idle (:func:`capture`, in its thread); the new worker thread loads
them in place of a fresh set-up (:func:`restore`). The states are plain
values: they travel in a fork as they are, and pickle for ``spawn``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from .._platform import torch_compat as _torch_compat
from . import rng as _rng
from .copies import WorkerParts

__all__ = ["RngStates", "WorkerHandoff", "capture", "restore"]


class RngStates(NamedTuple):
    """A worker's generators' states: what its global RNG API and ``WorkerInfo.rng`` draw from."""

    python: Any  # random.Random.getstate()
    torch: torch.Tensor  # torch.Generator.get_state() (its initial seed included)
    numpy_legacy: Any  # RandomState.get_state(), or None without NumPy
    numpy: Any  # the bit generator's state of WorkerInfo.rng.numpy_generator, or None


class WorkerHandoff(NamedTuple):
    """One worker, ready to go on elsewhere (``WorkerConfig.handoffs``)."""

    parts: WorkerParts
    rng: RngStates
    #: The failure of the worker's set-up (``worker_init_fn``), still due, or None.
    setup_error: Any
    #: The generation whose tasks that failure fails (None: the first task's).
    setup_gen: int | None


def _numpy_generator() -> Any:
    info = _torch_compat.get_thread_worker_info()
    return getattr(getattr(info, "rng", None), "numpy_generator", None)


def capture(parts: WorkerParts, setup_error: Any, setup_gen: int | None) -> WorkerHandoff:
    """The calling worker thread's handoff, taken between two of its tasks."""
    python, gen, legacy = _rng.calling_generators()
    numpy = _numpy_generator()
    states = RngStates(python.getstate(), gen.get_state(), None if legacy is None else legacy.get_state(),
                       None if numpy is None else numpy.bit_generator.state)
    return WorkerHandoff(parts, states, setup_error, setup_gen)


def restore(states: RngStates) -> None:
    """Load ``states`` into the calling worker thread's generators (after it entered as a worker)."""
    python, gen, legacy = _rng.calling_generators()
    python.setstate(states.python)
    gen.set_state(states.torch)
    if legacy is not None and states.numpy_legacy is not None:
        legacy.set_state(states.numpy_legacy)
    numpy = _numpy_generator()
    if numpy is not None and states.numpy is not None:
        numpy.bit_generator.state = states.numpy
