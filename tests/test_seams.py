"""The engine's seams: its pool protocol, its hooks, and what it does not import."""

from __future__ import annotations

import importlib
import importlib.util
import os
import pickle
import subprocess
import sys

import pytest

import threadloader
from threadloader import ThreadDataLoader
from threadloader.engine import hooks
from threadloader.engine.protocol import Job, Kind, Message, Pool
from threadloader.engine.thread_pool import ThreadPool, start_thread_pool


def test_the_engine_imports_neither_the_process_layer_nor_the_image_path():
    code = ("import sys, threadloader.engine; "
            "print(sorted(m for m in sys.modules if m.startswith(('threadloader.procs', 'threadloader.images', "
            "'threadloader.io'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_messages_and_jobs_pickle_as_themselves():
    # They cross process boundaries (worker_processes) as they are.
    message = Message(Kind.DATA, 3, 7, 1, [1, 2])
    assert pickle.loads(pickle.dumps(message)) == message
    assert type(pickle.loads(pickle.dumps(message)).kind) is Kind
    job = Job(5, 2, [0, 1])
    assert pickle.loads(pickle.dumps(job)) == job
    assert Kind.DATA == 0 and Kind.SYNCED == 4  # the numbers an older peer would send


def test_the_loader_hands_the_iterator_its_pool(monkeypatch):
    made: list[Pool] = []

    def counting_pool(cfg):
        pool = start_thread_pool(cfg)
        made.append(pool)
        return pool

    loader = ThreadDataLoader(list(range(6)), batch_size=2, num_workers=2)
    monkeypatch.setattr(loader, "_pool_factory", lambda: counting_pool)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5]]
    assert len(made) == 1 and isinstance(made[0], ThreadPool)


def test_iterator_hooks_run_while_an_in_process_iterator_runs(monkeypatch):
    calls: list[tuple] = []

    def hook(in_flight, pinned):
        calls.append(("start", in_flight, pinned))
        return lambda: calls.append(("end",))

    monkeypatch.setattr(hooks, "_iterator_hooks", ())
    hooks.on_iterator(hook)
    loader = ThreadDataLoader(list(range(8)), batch_size=2, num_workers=3, prefetch_factor=2)
    it = iter(loader)
    assert calls == [("start", 6, False)]
    next(it)
    it._shutdown_workers()
    assert calls == [("start", 6, False), ("end",)]


def test_worker_hooks_run_in_each_worker_thread(monkeypatch):
    import threading

    seen: list[tuple] = []
    lock = threading.Lock()

    def hook(items):
        with lock:
            seen.append(("start", threading.current_thread().name, items))
        return lambda: seen.append(("end", threading.current_thread().name))

    monkeypatch.setattr(hooks, "_worker_hooks", ())
    hooks.on_worker(hook)
    loader = ThreadDataLoader(list(range(8)), batch_size=4, num_workers=2)
    assert len(list(loader)) == 2
    starts = sorted(s for s in seen if s[0] == "start")
    assert starts == [("start", "threadloader-worker-0", 4), ("start", "threadloader-worker-1", 4)]


def test_a_failing_hook_ends_the_hooks_started_before_it(monkeypatch):
    ended: list[str] = []
    monkeypatch.setattr(hooks, "_worker_hooks", ())
    hooks.on_worker(lambda items: lambda: ended.append("first"))

    def failing(items):
        raise MemoryError("no room")

    hooks.on_worker(failing)
    with pytest.raises(MemoryError):
        hooks.start_worker(1)
    assert ended == ["first"]
    monkeypatch.setattr(hooks, "_worker_hooks", ())
    hooks.on_worker(lambda items: lambda: ended.append("a"))
    hooks.on_worker(lambda items: lambda: ended.append("b"))
    release = hooks.start_worker(1)
    release()
    assert ended == ["first", "b", "a"]  # the last started ends first


#: A public module path -> the modules that define what it exports.
PUBLIC_REEXPORTS = {
    "threadloader.frames": ("threadloader.images.frames",),
    "threadloader.device": ("threadloader.images.device", "threadloader.images.transform"),
}


@pytest.mark.parametrize("public", sorted(PUBLIC_REEXPORTS))
def test_a_public_path_is_a_module_of_its_own_that_re_exports(public):
    # A file static tools (mypy, IDEs, mkdocstrings) can read, whose names
    # are the very objects of the modules that define them.
    module = importlib.import_module(public)
    assert module.__file__.endswith(public.replace(".", os.sep) + ".py")
    homes = [importlib.import_module(home) for home in PUBLIC_REEXPORTS[public]]
    assert module.__all__
    for name in module.__all__:
        assert any(getattr(home, name, None) is getattr(module, name) for home in homes), name


@pytest.mark.parametrize("public", ["threadloader.io", "threadloader.state", "threadloader.worker",
                                    "threadloader.stats", "threadloader.integrations.accelerate"])
def test_the_other_public_paths_are_files_of_the_package(public):
    spec = importlib.util.find_spec(public)
    assert spec is not None and spec.origin is not None and os.path.isfile(spec.origin)
    assert os.path.dirname(threadloader.__file__) in spec.origin


@pytest.mark.parametrize("old", ["threadloader._engine", "threadloader._engine.worker_loop", "threadloader._procs",
                                 "threadloader._rng", "threadloader._torch_compat", "threadloader.io.image",
                                 "threadloader.datagen", "threadloader._pool"])
def test_the_old_private_paths_are_gone(old):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)

