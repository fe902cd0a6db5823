"""threadloader._platform.fork: what a forked child renews."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import held_by_another_thread

from threadloader._platform import fork as _fork

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


class _Guarded:
    def __init__(self) -> None:
        self.plain = threading.Lock()
        self.reentrant = threading.RLock()
        _fork.renew_lock_after_fork(self, "plain", "reentrant")


def test_locks_held_by_another_thread_at_a_fork_are_free_in_the_child_and_keep_their_kind() -> None:
    guarded = _Guarded()
    with held_by_another_thread(guarded.plain, guarded.reentrant):
        pid = os.fork()
        if pid == 0:  # the child's only thread: a new thread could reuse the holder's id
            code = 1
            try:
                signal.alarm(10)  # a lock still held would wait for ever
                with guarded.plain:
                    pass
                with guarded.reentrant, guarded.reentrant:  # still reentrant
                    pass
                plain_kind = type(guarded.plain) is type(threading.Lock())
                code = 0 if plain_kind and not guarded.plain.locked() else 2
            finally:
                sys.stdout.flush()
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert type(guarded.reentrant) is type(threading.RLock())  # the parent's are untouched


@pytest.mark.parametrize("mode, forks", [("native", "20"), ("loader", "3"), ("guard", "3")])
def test_fork_race_tool_counts_its_forks(mode: str, forks: str) -> None:
    # tools/fork_race.py backs the troubleshooting page's account of CPython gh-112275; a run
    # too short to meet the race still exercises each setting end to end.
    tool = Path(__file__).resolve().parents[1] / "tools" / "fork_race.py"
    done = subprocess.run(
        [sys.executable, str(tool), mode, forks], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert f", {mode}: {forks} " in done.stdout and "children hung" in done.stdout
