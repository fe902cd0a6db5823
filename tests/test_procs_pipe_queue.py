"""A child's job and result queues (threadloader.procs.pipe_queue): written straight to the pipe, in order, never blocking."""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from threadloader.procs.pipe_queue import PipeQueue

CTX = multiprocessing.get_context("fork")
PIPE_BYTES = 1 << 16  # Linux's default pipe capacity


def _read_all(q: PipeQueue, n: int) -> list:
    return [q.get() for _ in range(n)]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 3 * PIPE_BYTES), min_size=1, max_size=12))
def test_messages_arrive_whole_and_in_order_whatever_the_pipe_takes(sizes):
    q = PipeQueue(CTX)
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
    q = PipeQueue(CTX)
    try:
        for i in range(100):
            q.put((0, (i, 0, [i])))
        assert q.writer_thread is None
        assert _read_all(q, 100) == [(0, (i, 0, [i])) for i in range(100)]
    finally:
        q.close()


def test_puts_from_several_threads_each_arrive_whole():
    q = PipeQueue(CTX)
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
    q = PipeQueue(CTX)
    q.put(b"z" * (4 * PIPE_BYTES))  # the writer thread waits for room
    writer = q.writer_thread
    assert writer is not None and writer.is_alive()
    q.close()
    assert not writer.is_alive()
    with pytest.raises(ValueError, match="closed"):
        q.put(1)
    q.close()  # idempotent


def test_a_put_to_a_gone_child_is_dropped():
    q = PipeQueue(CTX)
    q.reader.close()  # the reading end gone: EPIPE
    q.put((0, (1, 0, [1])))
    q.put(b"w" * (4 * PIPE_BYTES))
    q.close()


def _child_reads(q: PipeQueue, out) -> None:
    out.put([q.get() for _ in range(3)])


def test_a_spawned_child_reads_what_the_parent_put():
    ctx = multiprocessing.get_context("spawn")
    q, out = PipeQueue(ctx), ctx.SimpleQueue()
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


def test_get_waits_as_a_multiprocessing_queue_does():
    q = PipeQueue(CTX)
    try:
        assert q.empty()
        with pytest.raises(queue.Empty):
            q.get(block=False)
        t0 = time.monotonic()
        with pytest.raises(queue.Empty):
            q.get(timeout=0.05)
        assert time.monotonic() - t0 >= 0.04
        q.put("a")
        assert not q.empty()
        assert q.get(timeout=5) == "a"
        q.put("b")
        assert q.get(block=False) == "b"
        assert q.empty()
    finally:
        q.close()


def test_a_forked_child_writes_while_the_parent_reads_late():
    q, read = PipeQueue(CTX), CTX.Event()
    sizes = [10, 3 * PIPE_BYTES, 5, PIPE_BYTES, 7]
    child = CTX.Process(target=_writer_child, args=(q, sizes, read))
    child.start()
    try:
        q.writer.close()  # the child's alone: its death reads as an end of file
        time.sleep(0.2)  # the child's pipe fills before anyone reads
        got = [q.get(timeout=30) for _ in sizes]
        read.set()
        assert got == [(i, b"r" * size) for i, size in enumerate(sizes)]
        with pytest.raises(EOFError):
            q.get(timeout=30)  # the child is gone and wrote nothing more
    finally:
        child.join(30)
        q.close()
    assert child.exitcode == 0


def _writer_child(q: PipeQueue, sizes: list[int], read) -> None:
    """A child that puts ``sizes``' messages, then exits once the parent has read them."""
    q.begin_writing()
    for i, size in enumerate(sizes):
        q.put((i, b"r" * size))
    read.wait(30)
