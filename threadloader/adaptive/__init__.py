"""The adaptive mode (``worker_processes=None``, the default): threads that move into processes when they hold the GIL,
or into the consumer's thread when their tasks cost less than the hand-offs.

``policy.py`` says when a loader may move its workers and when a move pays;
``pool.py`` is the pool that starts them as threads and moves them.
"""

from .policy import MIN_TASK_CPU_S, ineligible, inline_ineligible
from .pool import AdaptivePool

__all__ = ["MIN_TASK_CPU_S", "AdaptivePool", "ineligible", "inline_ineligible"]
