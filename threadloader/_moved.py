"""The modules' old import paths, kept working: each old name imports the module now at its new path.

The package was laid out by job (engine/, worker/, procs/, stats/, _platform/,
images/: see threadloader/README.md). Code written against the old paths,
``threadloader.frames`` and ``threadloader.device`` among them, keeps working:
an old name is the very module at the new path (one module object, so that
``monkeypatch.setattr`` on either name patches the code that runs).
:func:`install` puts the finder first on ``sys.meta_path``; ``import
threadloader`` runs it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import threading
from types import ModuleType

__all__ = ["MOVED", "install"]

#: Old module name -> the module's name now.
MOVED: dict[str, str] = {
    "threadloader._engine": "threadloader.engine",
    "threadloader._engine.iterator": "threadloader.engine.iterator",
    "threadloader._engine.single": "threadloader.engine.single",
    "threadloader._engine.protocol": "threadloader.engine.protocol",
    "threadloader._engine.hooks": "threadloader.engine.hooks",
    "threadloader._engine.worker_loop": "threadloader.engine.worker_loop",
    "threadloader._engine.thread_view": "threadloader.engine.thread_view",
    "threadloader._engine.pool": "threadloader.engine.thread_pool",
    "threadloader._engine.inherit": "threadloader.worker.inherit",
    "threadloader._engine.intraop": "threadloader.worker.intraop",
    "threadloader._replica": "threadloader.worker.copies",
    "threadloader._rng": "threadloader.worker.rng",
    "threadloader._datapipes": "threadloader.worker.datapipes",
    "threadloader._context": "threadloader.worker.context",
    "threadloader._collate": "threadloader.worker.collate",
    "threadloader._procs": "threadloader.procs",
    "threadloader._procs.arena": "threadloader.procs.arena",
    "threadloader._procs.child": "threadloader.procs.child",
    "threadloader._procs.counters": "threadloader.procs.counters",
    "threadloader._procs.mirror": "threadloader.procs.mirror",
    "threadloader._procs.wire": "threadloader.procs.wire",
    "threadloader._procs.pool": "threadloader.procs.process_pool",
    "threadloader._torch_compat": "threadloader._platform.torch_compat",
    "threadloader._fork": "threadloader._platform.fork",
    "threadloader._interpreter": "threadloader._platform.interpreter",
    "threadloader.io.image": "threadloader.images.decode",
    "threadloader.io.crop": "threadloader.images.crop",
    "threadloader.io.arrays": "threadloader.images.arrays",
    "threadloader.io._codec": "threadloader.images._codec",
    "threadloader.io._jpeg_stream": "threadloader.images._jpeg_stream",
    "threadloader.io._turbojpeg": "threadloader.images._turbojpeg",
    "threadloader.frames": "threadloader.images.frames",
    "threadloader._pool": "threadloader.images.buffers",
    "threadloader.device": "threadloader.images.device",
    "threadloader.datagen": "threadloader.images.datagen",
}


# ``from threadloader._engine import pool`` asks the package, which is now
# threadloader.engine, for ``threadloader.engine.pool``: an old child name
# under its package's new name leads to the same module.
_VIA_NEW_PARENT: dict[str, str] = {}
for _old, _new in MOVED.items():
    _parent, _, _child = _old.rpartition(".")
    if _parent in MOVED and f"{MOVED[_parent]}.{_child}" != _new:
        _VIA_NEW_PARENT[f"{MOVED[_parent]}.{_child}"] = _new
del _old, _new, _parent, _child


class _Loader(importlib.abc.Loader):
    """Loads an old name as the module at its new path (imported there, once)."""

    def __init__(self, new_name: str) -> None:
        self._new_name = new_name
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self._new_name)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system set the old name's spec on the module: give it its own back.
        module.__spec__ = self._spec


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        new_name = MOVED.get(fullname) or _VIA_NEW_PARENT.get(fullname)
        if new_name is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader(new_name))


_finder = _Finder()
_lock = threading.Lock()


def install() -> None:
    """Put the finder of old names first on ``sys.meta_path`` (idempotent)."""
    with _lock:
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
