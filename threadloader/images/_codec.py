"""The JPEG codec module: simplejpeg, or leanjpeg_simple on a free-threaded Python.

Both modules have the same API (``decode_jpeg``, ``decode_jpeg_header``,
``encode_jpeg``; leanjpeg-simple is a fork of simplejpeg 1.9 built on the same
libjpeg-turbo). simplejpeg has no wheel for free-threaded CPython (3.13t/3.14t)
and its extension does not declare itself GIL-free, so importing it there turns
the GIL back on for the whole process (unless ``PYTHON_GIL=0``).
leanjpeg-simple has free-threaded wheels and declares ``Py_MOD_GIL_NOT_USED``.
So a free-threaded build prefers leanjpeg_simple and a GIL build prefers
simplejpeg; either works on either build. Every JPEG call in threadloader goes
through :data:`jpeg`, so the choice is made here only.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .._platform.interpreter import FREE_THREADED_BUILD

__all__ = ["jpeg", "load"]


def load(free_threaded: bool = FREE_THREADED_BUILD) -> ModuleType:
    """Import the JPEG codec module preferred on this build.

    Args:
        free_threaded: whether to prefer the module that keeps the GIL off.

    Returns:
        ``leanjpeg_simple`` or ``simplejpeg``, whichever imports first in the
        preferred order.

    Raises:
        ImportError: neither is installed; the message says what to install.
    """
    order = ("leanjpeg_simple", "simplejpeg") if free_threaded else ("simplejpeg", "leanjpeg_simple")
    errors = []
    for name in order:
        try:
            return importlib.import_module(name)
        except ImportError as e:
            errors.append(f"{name}: {e}")
    wanted = "leanjpeg-simple" if free_threaded else "simplejpeg"
    raise ImportError(f"threadloader needs a JPEG codec: pip install {wanted} ({'; '.join(errors)})")


#: The codec module every JPEG encode/decode in threadloader uses.
jpeg: ModuleType = load()
