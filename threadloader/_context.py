"""Per-thread facts the engine hands to collate functions.

A collate function cannot see the loader that calls it. ``frame_collate`` needs
to know whether the loader pins its batches, so that it can allocate the batch
buffer pinned directly instead of pinning a copy afterwards. Each worker thread
collates for one loader only, so the engine sets this once per thread; nothing
here is global.
"""

from __future__ import annotations

import threading

_local = threading.local()


def pin_memory_requested() -> bool:
    """Whether the loader running this collate call pins its batches.

    Returns:
        True only inside a ThreadDataLoader worker thread whose loader has
        ``pin_memory=True`` *and* an accelerator exists; False elsewhere.
    """
    return getattr(_local, "pin", False)


def set_collating(pin: bool) -> None:
    """Set, for the calling thread, whether the batches it collates get pinned.

    Args:
        pin: whether results will be pinned (so may be allocated pinned, for
            the current accelerator, which is the one DataLoader pins for).
    """
    _local.pin = pin
