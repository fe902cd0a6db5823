"""Shared fixtures: every test must leave no worker thread behind."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("ci")


def worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("threadloader-")]


def wait_no_worker_threads(timeout: float = 5.0) -> list[threading.Thread]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = worker_threads()
        if not alive:
            return []
        time.sleep(0.01)
    return worker_threads()


@pytest.fixture(autouse=True)
def no_leaked_threads():
    yield
    import gc

    gc.collect()
    leaked = wait_no_worker_threads()
    assert not leaked, f"leaked worker threads: {leaked}"
