"""Free-threaded CPython: the JPEG codec choice, and that threadloader keeps the GIL off.

The suite as a whole runs on a free-threaded build with ``PYTHON_GIL=0``
(``.ci/free-threaded``); these tests check what only such a build can show,
and the codec choice on every build.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest

from threadloader._platform import interpreter as _interpreter
from threadloader.images import _codec


def _only(available: set[str], monkeypatch) -> None:
    """Pretend that only the named codec modules are installed."""
    real = importlib.import_module

    def fake(name: str, *args):
        if name in ("simplejpeg", "leanjpeg_simple") and name not in available:
            raise ImportError(f"No module named {name!r}")
        return real(name, *args)

    monkeypatch.setattr(_codec.importlib, "import_module", fake)


def _installed(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("free_threaded", [False, True])
def test_codec_prefers_the_build_s_module_and_falls_back(monkeypatch, free_threaded: bool) -> None:
    preferred, other = ("leanjpeg_simple", "simplejpeg") if free_threaded else ("simplejpeg", "leanjpeg_simple")
    for name in (preferred, other):
        if _installed(name):
            _only({name}, monkeypatch)
            assert _codec.load(free_threaded).__name__ == name
            monkeypatch.undo()
    if _installed(preferred) and _installed(other):
        assert _codec.load(free_threaded).__name__ == preferred
    if not (_installed(preferred) or _installed(other)):
        pytest.skip("no JPEG codec installed")


def test_codec_missing_is_one_clear_error(monkeypatch) -> None:
    _only(set(), monkeypatch)
    with pytest.raises(ImportError, match=r"^threadloader needs a JPEG codec: pip install leanjpeg-simple \("):
        _codec.load(free_threaded=True)
    with pytest.raises(ImportError, match=r"^threadloader needs a JPEG codec: pip install simplejpeg \("):
        _codec.load(free_threaded=False)


def test_the_codec_in_use_round_trips() -> None:
    import numpy as np

    pixels = np.zeros((16, 24, 3), np.uint8)
    pixels[:, :12] = 200
    data = _codec.jpeg.encode_jpeg(pixels, quality=95)
    assert _codec.jpeg.decode_jpeg_header(data)[:2] == (16, 24)
    assert np.abs(_codec.jpeg.decode_jpeg(data).astype(int) - pixels).max() < 8


@pytest.mark.skipif(not _interpreter.FREE_THREADED_BUILD, reason="needs a free-threaded Python")
def test_threadloader_keeps_the_gil_off() -> None:
    # Without PYTHON_GIL=0, importing an extension that does not declare
    # itself GIL-free turns the GIL back on: none of ours may.
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_GIL"}
    code = (
        "import sys, warnings\n"
        "warnings.simplefilter('error', RuntimeWarning)\n"
        "import numpy as np, PIL.Image, threadloader, threadloader.io\n"
        "from threadloader import ThreadDataLoader, frame_collate\n"
        "from threadloader.io import decode_image\n"
        "from threadloader.images._codec import jpeg\n"
        "data = jpeg.encode_jpeg(np.zeros((8, 8, 3), np.uint8))\n"
        "batches = list(ThreadDataLoader([data] * 4, batch_size=2, num_workers=2,\n"
        "                                collate_fn=lambda b: frame_collate([decode_image(x) for x in b])))\n"
        "assert len(batches) == 2\n"
        "print(jpeg.__name__, sys._is_gil_enabled())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["leanjpeg_simple", "False"], out.stdout


def test_gil_enabled_matches_the_interpreter() -> None:
    expected = sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True
    assert _interpreter.gil_enabled() is expected
    if not _interpreter.FREE_THREADED_BUILD:
        assert _interpreter.gil_enabled()
