"""Which thread started each Python thread (threadloader._platform.thread_origin)."""

from __future__ import annotations

import threading

from threadloader._platform import thread_origin


def _run(target, name: str) -> threading.Thread:
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


def test_threads_are_traced_to_the_thread_that_started_them_through_ended_ones():
    thread_origin.watch()
    thread_origin.watch()  # idempotent: one wrapper, not two
    stop, ready = threading.Event(), threading.Event()
    made = {}

    def child_body():
        made["grandchild"] = _run(stop.wait, "grandchild")

    def root_body():
        child = _run(child_body, "child")
        child.join()  # the thread between has ended before the check
        made["child"] = child
        ready.set()
        stop.wait()

    root = _run(root_body, "root")
    other = _run(stop.wait, "other")
    try:
        assert ready.wait(10)
        assert not made["child"].is_alive()
        assert thread_origin.started_within([root]) == [made["grandchild"]]
        assert thread_origin.started_within([other]) == []
        assert set(thread_origin.started_within([threading.current_thread()])) >= {root, other, made["grandchild"]}
    finally:
        stop.set()
        for thread in (root, other, *made.values()):
            thread.join(5)


def test_the_wrapper_keeps_thread_start_s_name_and_errors():
    thread_origin.watch()
    assert threading.Thread.start.__name__ == "start"
    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join()
    try:
        thread.start()
    except RuntimeError as e:
        assert str(e) == "threads can only be started once"
    else:
        raise AssertionError("a second start did not fail")
