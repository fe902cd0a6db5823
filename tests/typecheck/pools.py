"""Checked by mypy (``.ci/run``), never run: both pools are the engine's ``Pool``, both factories ``PoolFactory``."""

from __future__ import annotations

from threadloader.engine.protocol import Pool, PoolFactory
from threadloader.engine.thread_pool import ThreadPool, start_thread_pool
from threadloader.procs.process_pool import ProcessPool, process_pool_factory


def threads_are_a_pool(pool: ThreadPool) -> Pool:
    return pool


def processes_are_a_pool(pool: ProcessPool) -> Pool:
    return pool


THREADS: PoolFactory = start_thread_pool
PROCESSES: PoolFactory = process_pool_factory(2)
