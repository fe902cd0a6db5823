"""Run torch's own ``test/test_dataloader.py`` with DataLoader swapped for ThreadDataLoader.

Not collected by pytest (the file name does not start with ``test_``) and not
part of the suite: torch's test file is not ours to ship. Download the file of
the torch version you have installed. ``torch.testing._internal`` needs the
``expecttest`` package; ``--test-timeout`` needs ``pytest-timeout``. Install
them beside the environment rather than into it, then::

    pip install --target /tmp/suite-deps expecttest pytest-timeout --no-deps
    PYTHONPATH=$PWD:/tmp/suite-deps python tests/torch_suite/run_torch_suite.py \
        /tmp/test_dataloader.py --loader thread --test-timeout 120
    # the same with --loader torch for the baseline, --loader processes for
    # worker_processes, --loader threads-only for worker_processes=0, or
    # --compare for the baseline and the loader named

The swap is done by a ``sitecustomize`` module placed first on ``PYTHONPATH``
for the pytest run: it sets ``torch.utils.data.DataLoader`` to
``ThreadDataLoader`` before the test module's ``from torch.utils.data import
DataLoader`` runs, so the test module, the processes it spawns and the
``python -c`` scripts it starts all see the same class. ``--loader torch``
runs the same file, unchanged, for the baseline.

Prints the pass/fail/skip counts and the ids of the tests that did not pass;
``--compare`` runs both loaders and lists the tests that pass with DataLoader
but not with ThreadDataLoader.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

_SITECUSTOMIZE = '''\
# Written by threadloader's tests/torch_suite/run_torch_suite.py.
import torch.utils.data as _tud
from threadloader import ThreadDataLoader as _ThreadDataLoader

_tud.DataLoader = _ThreadDataLoader
'''

# ``--loader processes``: the same class, whose worker threads run in child
# processes by default (``worker_processes = min(num_workers, P)``). A subclass,
# generic and with the keyword's own default, so ``type(loader)(**args)`` and
# ``DataLoader[T]`` in the tests keep working.
_SITECUSTOMIZE_PROCESSES = '''\
# Written by threadloader's tests/torch_suite/run_torch_suite.py.
import inspect as _inspect
import os as _os
import typing as _typing
import torch.utils.data as _tud
from threadloader import ThreadDataLoader as _ThreadDataLoader

_P = int(_os.environ.get("THREADLOADER_SUITE_PROCESSES", "2"))
_T_co = _typing.TypeVar("_T_co", covariant=True)


class ProcessesDataLoader(_ThreadDataLoader[_T_co]):
    def __init__(self, *args, worker_processes=None, **kwargs):
        if worker_processes is None:
            n = args[5] if len(args) > 5 else kwargs.get("num_workers", 0)
            worker_processes = min(n, _P) if isinstance(n, int) and n > 0 else 0
        super().__init__(*args, worker_processes=worker_processes, **kwargs)


ProcessesDataLoader.__init__.__signature__ = _inspect.signature(_ThreadDataLoader.__init__)


_tud.DataLoader = ProcessesDataLoader
'''

# ``--loader threads-only``: the same class with ``worker_processes=0`` by
# default, so the workers stay threads (no adaptive move).
_SITECUSTOMIZE_THREADS_ONLY = '''\
# Written by threadloader's tests/torch_suite/run_torch_suite.py.
import inspect as _inspect
import typing as _typing
import torch.utils.data as _tud
from threadloader import ThreadDataLoader as _ThreadDataLoader

_T_co = _typing.TypeVar("_T_co", covariant=True)


class ThreadsOnlyDataLoader(_ThreadDataLoader[_T_co]):
    def __init__(self, *args, worker_processes=0, **kwargs):
        super().__init__(*args, worker_processes=worker_processes, **kwargs)


ThreadsOnlyDataLoader.__init__.__signature__ = _inspect.signature(_ThreadDataLoader.__init__)


_tud.DataLoader = ThreadsOnlyDataLoader
'''

_SITES = {"thread": _SITECUSTOMIZE, "processes": _SITECUSTOMIZE_PROCESSES,
          "threads-only": _SITECUSTOMIZE_THREADS_ONLY}

_LABELS = {"torch": "DataLoader", "thread": "ThreadDataLoader", "processes": "ThreadDataLoader(worker_processes)",
           "threads-only": "ThreadDataLoader(worker_processes=0)"}


def run(test_file: Path, loader: str, timeout_s: float, pytest_args: list[str],
        test_timeout_s: float = 0) -> dict[str, str]:
    """Run the test file under pytest with ``loader`` ('thread', 'processes', 'threads-only' or 'torch').

    Returns:
        test id -> outcome ('passed', 'failed', 'error' or 'skipped').
    """
    with tempfile.TemporaryDirectory(prefix="torch_suite_") as tmp:
        work = Path(tmp)
        # The module keeps its name: it imports itself by file name.
        shutil.copy(test_file, work / "test_dataloader.py")
        env = dict(os.environ)
        paths = [str(work)]
        if loader != "torch":
            site = work / "site"
            site.mkdir()
            (site / "sitecustomize.py").write_text(_SITES[loader])
            paths.insert(0, str(site))
        repo = str(Path(__file__).resolve().parents[2])
        paths.append(repo)
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        report = work / "report.xml"
        per_test = []
        if test_timeout_s > 0:
            # A test that hangs (torch's forkserver test leaves the start method
            # changed for the rest of the run) fails alone instead of stalling the run.
            per_test = [f"--timeout={test_timeout_s:g}"]  # the plugin loads through its entry point
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(work),
               f"--junitxml={report}", *per_test, str(work / "test_dataloader.py"), *pytest_args]
        try:
            subprocess.run(cmd, cwd=work, env=env, timeout=timeout_s, check=False,
                           stdout=subprocess.DEVNULL if "-v" not in pytest_args else None)
        except subprocess.TimeoutExpired:
            print(f"[{loader}] pytest did not finish within {timeout_s:.0f} s", file=sys.stderr)
        if not report.exists():
            raise SystemExit(f"[{loader}] pytest wrote no report")
        outcomes = _outcomes(report)
        for reason, n in sorted(SKIP_REASONS.pop(str(report)).items(), key=lambda kv: -kv[1]):
            print(f"  [{loader}] skipped {n}: {reason[:120]}")
        return outcomes


#: Why tests were skipped, by reason (filled by :func:`_outcomes`).
SKIP_REASONS: dict[str, dict[str, int]] = {}


def _outcomes(report: Path) -> dict[str, str]:
    outcomes = {}
    reasons: dict[str, int] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                if child.tag == "skipped":
                    reason = (child.get("message") or "").strip()
                    reasons[reason] = reasons.get(reason, 0) + 1
                break
        outcomes[name] = outcome
    SKIP_REASONS[str(report)] = reasons
    return outcomes


def summary(label: str, outcomes: dict[str, str]) -> None:
    counts: dict[str, int] = {}
    for outcome in outcomes.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    print(f"{label}: " + ", ".join(f"{k} {counts.get(k, 0)}" for k in ("passed", "failed", "error", "skipped")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("test_file", type=Path, help="a copy of torch's test/test_dataloader.py")
    parser.add_argument("--loader", choices=("thread", "processes", "threads-only", "torch"), default="thread",
                        help="processes: ThreadDataLoader with worker_processes=min(num_workers, P), "
                             "P from $THREADLOADER_SUITE_PROCESSES (default 2); "
                             "threads-only: worker_processes=0")
    parser.add_argument("--compare", action="store_true", help="run both loaders and list the differences")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per pytest run")
    parser.add_argument("--test-timeout", type=float, default=0.0,
                        help="seconds per test (needs the pytest-timeout plugin importable); 0: none")
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    parser.epilog = "Arguments after '--' go to pytest (e.g. -- -k 'worker_info' -v)."
    args = parser.parse_args(own)
    args.pytest_args = pytest_args
    if not args.test_file.is_file():
        parser.error(f"no such file: {args.test_file}")
    loaders = ("torch", args.loader if args.loader != "torch" else "thread") if args.compare else (args.loader,)
    results = {}
    for loader in loaders:
        results[loader] = run(args.test_file, loader, args.timeout, args.pytest_args, args.test_timeout)
        summary(_LABELS[loader], results[loader])
        not_passed = sorted(k for k, v in results[loader].items() if v in ("failed", "error"))
        for name in not_passed:
            print(f"  {results[loader][name]}: {name}")
    if args.compare:
        base, ours = results[loaders[0]], results[loaders[1]]
        lost = sorted(k for k, v in base.items() if v == "passed" and ours.get(k) != "passed")
        print(f"pass with DataLoader: {sum(v == 'passed' for v in base.values())}; "
              f"of those pass with {_LABELS[loaders[1]]}: {sum(v == 'passed' for v in base.values()) - len(lost)}")
        for name in lost:
            print(f"  differs: {name} ({ours.get(name, 'missing')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
