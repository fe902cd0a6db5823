"""A child's job queue (threadloader.procs.jobs): written straight to the pipe, in order, never blocking."""

from __future__ import annotations

import multiprocessing
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from threadloader.procs.jobs import JobQueue

CTX = multiprocessing.get_context("fork")
PIPE_BYTES = 1 << 16  # Linux's default pipe capacity


def _read_all(q: JobQueue, n: int) -> list:
    return [q.get() for _ in range(n)]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 3 * PIPE_BYTES), min_size=1, max_size=12))
def test_messages_arrive_whole_and_in_order_whatever_the_pipe_takes(sizes):
    q = JobQueue(CTX)
    try:
        sent = [(i, b"x" * size) for i, size in enumerate(sizes)]
        putter = threading.Thread(target=lambda: [q.put(message) for message in sent])
        putter.start()
        putter.join(30)  # nobody reads yet: what does not fit waits in the backlog, no put waits
        assert not putter.is_alive()
        assert _read_all(q, len(sent)) == sent
    finally:
        q.close()


def test_small_messages_need_no_thread():
    q = JobQueue(CTX)
    try:
        for i in range(100):
            q.put((0, (i, 0, [i])))
        assert q.writer_thread is None
        assert _read_all(q, 100) == [(0, (i, 0, [i])) for i in range(100)]
    finally:
        q.close()


def test_puts_from_several_threads_each_arrive_whole():
    q = JobQueue(CTX)
    big = b"y" * (PIPE_BYTES // 3)

    def put_many(k: int) -> None:
        for i in range(20):
            q.put((k, i, big))

    threads = [threading.Thread(target=put_many, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    got = _read_all(q, 60)
    for t in threads:
        t.join()
    q.close()
    for k in range(3):  # each thread's messages in its order
        assert [i for kk, i, data in got if kk == k] == list(range(20))
    assert all(data == big for _, _, data in got)


def test_a_closed_queue_refuses_puts_and_its_writer_thread_ends():
    q = JobQueue(CTX)
    q.put(b"z" * (4 * PIPE_BYTES))  # the writer thread waits for room
    writer = q.writer_thread
    assert writer is not None and writer.is_alive()
    q.close()
    assert not writer.is_alive()
    with pytest.raises(ValueError, match="closed"):
        q.put(1)
    q.close()  # idempotent


def test_a_put_to_a_gone_child_is_dropped():
    q = JobQueue(CTX)
    q.reader.close()  # the reading end gone: EPIPE
    q.put((0, (1, 0, [1])))
    q.put(b"w" * (4 * PIPE_BYTES))
    q.close()


def _child_reads(q: JobQueue, out) -> None:
    out.put([q.get() for _ in range(3)])


def test_a_spawned_child_reads_what_the_parent_put():
    ctx = multiprocessing.get_context("spawn")
    q, out = JobQueue(ctx), ctx.SimpleQueue()
    child = ctx.Process(target=_child_reads, args=(q, out))
    child.start()
    try:
        sent = [1, b"v" * (2 * PIPE_BYTES), (2, "three")]
        for message in sent:
            q.put(message)
        assert out.get() == sent
    finally:
        child.join(30)
        q.close()
    assert child.exitcode == 0
