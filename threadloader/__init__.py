"""threadloader: a thread-based drop-in replacement for torch's DataLoader.

``from threadloader import ThreadDataLoader as DataLoader`` and keep your code.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

__all__ = [
    "ThreadDataLoader",
    "get_worker_info",
    "Frame",
    "frame_collate",
    "to_device",
    "__version__",
]

# Imported lazily so that ``import threadloader`` stays cheap and so that the
# image stack (simplejpeg, Pillow) loads only when a user touches it.
_LAZY = {
    "ThreadDataLoader": "threadloader.loader",
    "get_worker_info": "threadloader.worker",
    "Frame": "threadloader.images.frames",
    "frame_collate": "threadloader.images.frames",
    "to_device": "threadloader.images.device",
    "io": "threadloader.io",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'threadloader' has no attribute {name!r}")
    mod = importlib.import_module(module)
    value = mod if module.endswith("." + name) else getattr(mod, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
