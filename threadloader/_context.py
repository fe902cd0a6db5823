"""Per-thread facts the engine hands to collate functions.

A collate function cannot see the loader that calls it. ``frame_collate`` needs
to know whether the loader asked for pinned memory, so that it can allocate the
batch buffer pinned directly instead of pinning a copy afterwards. The engine
sets these thread-locally around each collate call; nothing here is global.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

_local = threading.local()


def pin_memory_requested() -> bool:
    """Whether the loader running this collate call pins its batches.

    Returns:
        True only inside a ThreadDataLoader collate call whose loader has
        ``pin_memory=True`` *and* an accelerator exists; False elsewhere.
    """
    return getattr(_local, "pin", False)


def pin_memory_device() -> str | None:
    """The accelerator type batches are pinned for (e.g. ``"cuda"``), or None."""
    return getattr(_local, "device", None) if pin_memory_requested() else None


def set_collating(pin: bool, device: str | None = None) -> None:
    """Set, for the calling thread, whether the batches it collates get pinned.

    Args:
        pin: whether results will be pinned (so may be allocated pinned).
        device: the accelerator type the memory is pinned for.
    """
    _local.pin, _local.device = pin, device


@contextlib.contextmanager
def collating(pin: bool, device: str | None = None) -> Iterator[None]:
    """Mark the current thread as running a collate call of a loader.

    Args:
        pin: whether the result will be pinned (and may be allocated pinned).
        device: the accelerator type the memory is pinned for.
    """
    old = (getattr(_local, "pin", False), getattr(_local, "device", None))
    _local.pin, _local.device = pin, device
    try:
        yield
    finally:
        _local.pin, _local.device = old
