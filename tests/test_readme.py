"""The README's code runs as written, and its set-up commands are what CI runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def fenced(language: str, text: str = README) -> list[str]:
    """The bodies of the ``language`` code blocks of a Markdown text, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE)


def test_the_readme_has_python_blocks() -> None:
    assert len(fenced("python")) >= 3


@pytest.mark.parametrize("index", range(len(fenced("python"))))
def test_readme_python_block_runs(index: int, tmp_path: Path) -> None:
    code = fenced("python")[index]
    if "torchvision" in code:
        pytest.importorskip("torchvision")
    script = tmp_path / f"readme_block_{index}.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    # A block runs as a user would run it: a fresh interpreter, the README's
    # code alone, the CPU only.
    env["CUDA_VISIBLE_DEVICES"] = ""
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, check=False,
                          text=True, timeout=300)
    assert done.returncode == 0, f"README python block {index} failed:\n{code}\n{done.stderr[-3000:]}"


def test_the_readme_test_command_is_what_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line for block in fenced("bash") for line in block.splitlines() if "pytest" in line]
    assert len(commands) == 1
    assert commands[0].strip() in ci


def test_the_readme_install_command_installs_the_bench_and_runs_it() -> None:
    commands = [line for block in fenced("bash") for line in block.splitlines() if "threadloader bench" in line]
    assert commands and all(".[bench]" in c for c in commands)
    assert "pip install torch==2.14.1 torchvision==0.29.1" in commands[0]


def test_the_readme_stays_short() -> None:
    assert len(README.splitlines()) <= 250
