"""The engine's seams: its pool protocol, its hooks, and what it does not import."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import pytest

from threadloader import ThreadDataLoader
from threadloader._moved import MOVED
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


def test_every_old_import_path_is_the_module_at_its_new_one():
    # In a fresh interpreter: each old name imported first, before its module.
    code = ("import importlib, json, sys, threadloader; from threadloader._moved import MOVED; "
            "bad = [old for old, new in sorted(MOVED.items()) if importlib.import_module(old) is not "
            "importlib.import_module(new) or sys.modules[new].__spec__.name != new]; print(json.dumps(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []
    # ``from old_package import old_module``: the package is found under its new name first.
    code = ("import importlib, json, threadloader; from threadloader._moved import MOVED; bad = []\n"
            "for old, new in sorted(MOVED.items()):\n"
            "    parent, _, child = old.rpartition('.')\n"
            "    if parent in MOVED:\n"
            "        got = getattr(__import__(parent, fromlist=[child]), child)\n"
            "        bad += [] if got is importlib.import_module(new) else [old]\n"
            "print(json.dumps(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []
    assert "threadloader.frames" in MOVED and "threadloader.device" in MOVED  # public paths


def test_patching_an_old_path_patches_the_code_that_runs(monkeypatch):
    import threadloader._engine.worker_loop as old_path
    from threadloader.engine import worker_loop

    assert old_path is worker_loop
    monkeypatch.setattr(old_path, "samples_in", lambda index: 99)
    assert worker_loop.samples_in([1, 2]) == 99

