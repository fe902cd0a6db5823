"""CPU time and page faults of this process and its worker processes, read from Linux ``/proc``.

Two numbers that tell where a loader's time goes, beside its rate:

* CPU seconds per wall second, the cores a loader kept busy: threads that wait
  for each other (the GIL, a lock, the kernel's address-space lock) use fewer
  cores than they have workers, processes do not;
* page faults, the fresh memory it touched: with many threads in one process
  faults serialise on the address space's lock, which is why the buffer pools
  exist.

Worker processes are found as live descendants of this process. A child that
ended and was reaped still counts: the kernel adds its totals to this
process's ``RUSAGE_CHILDREN``. Without that, a DataLoader whose epoch ends
inside the timed part would lose its workers' CPU time and show negative
cores.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass

from ..stats.cpu import usable_cores

__all__ = ["Usage", "usage", "usable_cores"]


@dataclass(frozen=True)
class Usage:
    """CPU seconds (user + system) and page faults (minor + major) so far.

    ``resolution_s`` bounds the error of ``cpu_s``: about zero where each
    process's CPU clock could be read, one clock tick (usually 10 ms) per
    process where only ``/proc`` ticks were; a difference of two readings
    is off by at most the larger of theirs.
    """

    cpu_s: float
    faults: int
    resolution_s: float = 0.0

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(self.cpu_s + other.cpu_s, self.faults + other.faults, self.resolution_s + other.resolution_s)

    def __sub__(self, other: "Usage") -> "Usage":
        return Usage(self.cpu_s - other.cpu_s, self.faults - other.faults,
                     max(self.resolution_s, other.resolution_s))


def _process_clock(pid: int) -> int:
    """Linux's clock id of a process's CPU clock: ``MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)``."""
    return (~pid << 3) | 2


def _cpu_clock_s(pid: int) -> float | None:
    """CPU seconds of process ``pid``, all its threads (ended ones too), at ns resolution; None if unreadable."""
    try:
        return time.clock_gettime(_process_clock(pid))
    except (OSError, OverflowError, AttributeError, ValueError):
        return None


def _stat_fields(pid: int | str) -> list[bytes]:
    # /proc/PID/stat: the command name is in parentheses and may hold spaces.
    # After it: state, ppid, ... minflt (8th), majflt (10th), utime (12th),
    # stime (13th), the times in clock ticks.
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()


def _usage_of(pid: int, fields: list[bytes], tick_s: float) -> Usage:
    faults = int(fields[7]) + int(fields[9])
    cpu = _cpu_clock_s(pid)
    if cpu is not None:
        return Usage(cpu, faults)
    return Usage((int(fields[11]) + int(fields[12])) * tick_s, faults, tick_s)


def _processes() -> dict[int, list[bytes]]:
    """pid -> its /proc stat fields, for every process that is still there."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                table[int(entry)] = _stat_fields(entry)
            except OSError:  # it ended meanwhile
                pass
    return table


def _descendants(pid: int, table: dict[int, list[bytes]]) -> list[int]:
    """Live descendants of ``pid`` in ``table`` (the parent is its second field)."""
    children: dict[int, list[int]] = {}
    for child, fields in table.items():
        try:
            children.setdefault(int(fields[1]), []).append(child)
        except (IndexError, ValueError):
            pass
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _reaped_children() -> Usage:
    """CPU time and page faults of this process's children that ended and were waited for."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return Usage(r.ru_utime + r.ru_stime, r.ru_minflt + r.ru_majflt)


def usage() -> Usage | None:
    """CPU time and page faults so far of this process and its descendants, or None.

    Live descendants are read from ``/proc``; children that ended and were
    reaped from ``RUSAGE_CHILDREN``. Linux only (``/proc``); None elsewhere
    or when unreadable. CPU time is read from each process's CPU clock
    (nanoseconds); where that fails, from ``/proc`` in clock ticks (usually
    10 ms), which ``resolution_s`` says.
    """
    try:
        tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
        table = _processes()
        me = os.getpid()
        total = _usage_of(me, table[me], tick_s) + _reaped_children()
    except (OSError, KeyError, IndexError, ValueError, AttributeError):
        return None
    for pid in _descendants(me, table):
        try:
            total = total + _usage_of(pid, table[pid], tick_s)
        except (IndexError, ValueError):
            pass
    return total
