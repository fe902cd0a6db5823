"""Checked by mypy (``.ci/run``), never run: every pool is the engine's ``Pool``, every factory a ``PoolFactory``."""

from __future__ import annotations

from threadloader.adaptive import AdaptivePool
from threadloader.engine.protocol import Adapts, Pool, PoolFactory
from threadloader.engine.thread_pool import ThreadPool, start_thread_pool
from threadloader.procs.process_pool import ProcessPool, process_pool_factory


def threads_are_a_pool(pool: ThreadPool) -> Pool:
    return pool


def processes_are_a_pool(pool: ProcessPool) -> Pool:
    return pool


def the_adaptive_pool_is_a_pool(pool: AdaptivePool) -> Pool:
    return pool


def the_adaptive_pool_adapts(pool: AdaptivePool) -> Adapts:
    return pool


THREADS: PoolFactory = start_thread_pool
PROCESSES: PoolFactory = process_pool_factory(2)
