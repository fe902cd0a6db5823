"""CPU time and page faults of this process and its worker processes, read from Linux ``/proc``.

Two numbers that tell where a loader's time goes, beside its rate:

* CPU seconds per wall second, the cores a loader kept busy: threads that wait
  for each other (the GIL, a lock, the kernel's address-space lock) use fewer
  cores than they have workers, processes do not;
* page faults, the fresh memory it touched: with many threads in one process
  faults serialise on the address space's lock, which is why the buffer pools
  exist.

Worker processes are found as live descendants of this process; processes that
ended are not counted (the loaders' workers live as long as the timed part).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["Usage", "usage"]


@dataclass(frozen=True)
class Usage:
    """CPU seconds (user + system) and page faults (minor + major) so far."""

    cpu_s: float
    faults: int

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(self.cpu_s + other.cpu_s, self.faults + other.faults)

    def __sub__(self, other: "Usage") -> "Usage":
        return Usage(self.cpu_s - other.cpu_s, self.faults - other.faults)


def _stat_fields(pid: int | str) -> list[bytes]:
    # /proc/PID/stat: the command name is in parentheses and may hold spaces.
    # After it: state, ppid, ... minflt (8th), majflt (10th), utime (12th),
    # stime (13th), the times in clock ticks.
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()


def _usage_of(fields: list[bytes], tick_s: float) -> Usage:
    return Usage((int(fields[11]) + int(fields[12])) * tick_s, int(fields[7]) + int(fields[9]))


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


def usage() -> Usage | None:
    """CPU time and page faults so far of this process and its live descendants, or None.

    Linux only (``/proc``); None elsewhere or when unreadable. CPU time has
    the kernel's clock-tick resolution (usually 10 ms): read it over runs of
    a second or more.
    """
    try:
        tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
        table = _processes()
        total = _usage_of(table[os.getpid()], tick_s)
    except (OSError, KeyError, IndexError, ValueError, AttributeError):
        return None
    for pid in _descendants(os.getpid(), table):
        try:
            total = total + _usage_of(table[pid], tick_s)
        except (IndexError, ValueError):
            pass
    return total
