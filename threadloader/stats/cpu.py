"""CPU accounting: the CPUs this process may use, and CPU time, the machine's and this process's."""

from __future__ import annotations

import os
import time

__all__ = ["process_cpu_seconds", "system_cpu_seconds", "usable_cores", "usable_cpus"]


def usable_cpus() -> list[int] | None:
    """The CPUs this process may run on (its affinity: taskset, containers, SLURM), or None if unknown."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return None


def usable_cores() -> int:
    """How many cores this process may run on (its CPU affinity, else the machine's count)."""
    cpus = usable_cpus()
    return len(cpus) if cpus else os.cpu_count() or 1


def system_cpu_seconds(cpus: list[int] | None = None) -> tuple[float, float] | None:
    """CPU time of the machine, or of ``cpus`` only: ``(busy seconds summed over cores, wall-clock reference)``.

    ``busy`` counts every process's CPU use (user, system, interrupts, steal),
    not idle or I/O wait. Read from psutil when installed, else Linux's
    ``/proc/stat``; None where neither is available (the caller then cannot
    tell a full machine from a GIL-bound process, and assumes a free core).
    """
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        try:
            if cpus is None:
                times = [psutil.cpu_times()]
            else:
                per_cpu = psutil.cpu_times(percpu=True)
                times = [per_cpu[i] for i in cpus if i < len(per_cpu)]
            busy = 0.0
            for t in times:
                idle = t.idle + getattr(t, "iowait", 0.0)
                # guest time is already inside user time on Linux
                busy += sum(t) - idle - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
            return busy, time.perf_counter()
        except Exception:  # noqa: BLE001 - any platform oddity: fall through to /proc/stat
            pass
    wanted = {b"cpu"} if cpus is None else {b"cpu%d" % i for i in cpus}
    try:
        with open("/proc/stat", "rb") as f:
            rows = [line.split() for line in f if line.startswith(b"cpu")]
        hz = os.sysconf("SC_CLK_TCK")
        busy_ticks = 0
        for fields in rows:
            if fields[0] in wanted:
                ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
                busy_ticks += sum(ticks) - ticks[3] - ticks[4]
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return busy_ticks / hz, time.perf_counter()


def process_cpu_seconds() -> float:
    """CPU time of this process, every thread (library thread pools included)."""
    return time.process_time()
