"""What makes a thread a DataLoader worker: its info, its dataset copies, its RNG, its thread state.

``threadloader.worker`` is also the public path of :func:`get_worker_info`
(:mod:`.info`), loaded on first use: importing a module of this package
installs nothing.

* :mod:`.info` -- worker info and seeds, as torch's worker loop sets them;
* :mod:`.copies` -- each worker's copies of the dataset and of its hooks;
* :mod:`.rng` -- each worker thread's own random generators, and the routing to them;
* :mod:`.datapipes` -- DataPipe graphs: worker copies, sharding, seeding;
* :mod:`.collate` -- ``default_collate``'s tensor entry in a worker (no needless shared memory);
* :mod:`.context` -- per-thread facts collate functions read (pinning, the child's arena);
* :mod:`.inherit` -- what a worker thread takes over from the thread starting it;
* :mod:`.intraop` -- one torch intra-op thread per worker thread.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["enter_worker", "get_worker_info", "leave_worker", "seed_process"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.info"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
