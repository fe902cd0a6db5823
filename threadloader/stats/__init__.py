"""Where an iterator's time goes: counters, the GIL diagnosis, CPU accounting.

``threadloader.stats`` is the public path of :class:`LoaderStats` (``loader.stats()``).

* :mod:`.counters` -- :class:`WorkerCounters` (each worker's) and :class:`LoaderStats` (the iterator's);
* :mod:`.gil` -- whether busy workers take turns on one GIL, and the warning that says so;
* :mod:`.cpu` -- CPU accounting: usable CPUs, the machine's and this process's CPU time.
"""

from __future__ import annotations

from .._platform.interpreter import gil_enabled
from .counters import LoaderStats, WorkerCounters
from .cpu import process_cpu_seconds, system_cpu_seconds, usable_cpus
from .gil import FREE_CORE_THRESHOLD, GIL_CHECK_INTERVAL_S, GIL_WARNING, GIL_WARNING_PROCESSES

__all__ = ["FREE_CORE_THRESHOLD", "GIL_CHECK_INTERVAL_S", "GIL_WARNING", "GIL_WARNING_PROCESSES", "LoaderStats",
           "WorkerCounters", "gil_enabled", "process_cpu_seconds", "system_cpu_seconds", "usable_cpus"]
