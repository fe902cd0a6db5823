"""Decode only a region of a JPEG, through libjpeg-turbo's TurboJPEG 3 API.

simplejpeg always decodes the whole image. TurboJPEG 3 can be told a cropping
region (``tj3SetCroppingRegion``): libjpeg-turbo then stops after the region's
last row, skips the IDCT and colour conversion of the rows above it, and
decodes only the MCU columns it covers -- on top of DCT-domain scaling. That
is what a random-resized-crop loader needs: no more pixels than the crop.

The library is found, in order, at ``$THREADLOADER_TURBOJPEG``, inside the
``turbojpeg`` wheel from PyPI (which bundles a TurboJPEG 3 build; installed
with threadloader on Linux x86-64), or as the system's ``libturbojpeg`` if it
is version 3. Without one, :func:`available` is False and callers decode the
whole image instead. The C API reports errors through return codes (no
``longjmp`` crosses into Python), and ctypes releases the GIL during each call.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.metadata
import os
import threading
from typing import Any

import numpy as np

from .._platform.fork import renew_after_fork

__all__ = ["available", "decode_region", "library_path"]

# TurboJPEG 3 constants (turbojpeg.h).
_TJINIT_DECOMPRESS = 1
_TJPARAM_STOPONWARNING = 0
_TJERR_WARNING = 0
_TJPARAM_SUBSAMP = 4
_TJPARAM_JPEGWIDTH = 5
_TJPARAM_JPEGHEIGHT = 6
_TJPARAM_FASTUPSAMPLE = 9
_TJPARAM_FASTDCT = 10
_TJPF_RGB = 0
#: MCU width in pixels per chroma subsampling (TJSAMP_444, 422, 420, GRAY, 440, 411, 441).
_MCU_WIDTH = {0: 8, 1: 16, 2: 16, 3: 8, 4: 8, 5: 32, 6: 8}


class _ScalingFactor(ctypes.Structure):
    _fields_ = [("num", ctypes.c_int), ("denom", ctypes.c_int)]


class _Region(ctypes.Structure):
    _fields_ = [("x", ctypes.c_int), ("y", ctypes.c_int), ("w", ctypes.c_int), ("h", ctypes.c_int)]


_lock = threading.Lock()
renew_after_fork(__name__, "_lock")
_loaded: tuple[Any, str | None] | None = None


def _candidates() -> list[str]:
    paths = []
    if os.environ.get("THREADLOADER_TURBOJPEG"):
        paths.append(os.environ["THREADLOADER_TURBOJPEG"])
    try:
        dist = importlib.metadata.distribution("turbojpeg")
        for f in dist.files or ():
            if os.path.basename(str(f)).startswith("libturbojpeg") and ".so" in str(f):
                paths.append(str(dist.locate_file(f)))
    except importlib.metadata.PackageNotFoundError:
        pass
    system = ctypes.util.find_library("turbojpeg")
    if system:
        paths.append(system)
    return paths


def _bind(path: str) -> Any:
    lib = ctypes.CDLL(path)
    if not hasattr(lib, "tj3SetCroppingRegion"):  # TurboJPEG 2 has no cropping
        raise OSError(f"{path} has no TurboJPEG 3 API")
    vp, c_int = ctypes.c_void_p, ctypes.c_int
    lib.tj3Init.restype, lib.tj3Init.argtypes = vp, [c_int]
    lib.tj3Destroy.restype, lib.tj3Destroy.argtypes = None, [vp]
    lib.tj3Set.restype, lib.tj3Set.argtypes = c_int, [vp, c_int, c_int]
    lib.tj3Get.restype, lib.tj3Get.argtypes = c_int, [vp, c_int]
    lib.tj3DecompressHeader.restype = c_int
    lib.tj3DecompressHeader.argtypes = [vp, ctypes.c_char_p, ctypes.c_size_t]
    lib.tj3SetScalingFactor.restype, lib.tj3SetScalingFactor.argtypes = c_int, [vp, _ScalingFactor]
    lib.tj3SetCroppingRegion.restype, lib.tj3SetCroppingRegion.argtypes = c_int, [vp, _Region]
    lib.tj3Decompress8.restype = c_int
    lib.tj3Decompress8.argtypes = [vp, ctypes.c_char_p, ctypes.c_size_t, vp, c_int, c_int]
    lib.tj3GetErrorStr.restype, lib.tj3GetErrorStr.argtypes = ctypes.c_char_p, [vp]
    lib.tj3GetErrorCode.restype, lib.tj3GetErrorCode.argtypes = c_int, [vp]
    return lib


def _library() -> tuple[Any, str | None]:
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = (None, None)
            for path in _candidates():
                try:
                    _loaded = (_bind(path), path)
                    break
                except OSError:
                    continue
        return _loaded


def available() -> bool:
    """Whether region decoding is possible here (a TurboJPEG 3 library was found)."""
    return _library()[0] is not None


def library_path() -> str | None:
    """The TurboJPEG library in use, or None."""
    return _library()[1]


def decode_region(
    data: bytes, factor: int, box: tuple[int, int, int, int], *, fastdct: bool = False, fastupsample: bool = False,
    stop_on_warning: bool = True,
) -> np.ndarray:
    """Decode rows ``top:bottom`` and columns ``left:right`` of a JPEG at scale ``1/factor``.

    Args:
        data: the JPEG file's bytes.
        factor: DCT scaling denominator (1, 2, 4 or 8).
        box: ``(top, left, bottom, right)`` in the *scaled* image, non-empty,
            inside it.
        fastdct: use the fast, less accurate integer IDCT.
        fastupsample: use the fast (non-smooth) chroma upsampling.
        stop_on_warning: libjpeg's warnings are errors (False: they are ignored).

    Returns:
        ``(bottom - top, right - left, 3)`` uint8 RGB pixels.

    Raises:
        RuntimeError: no TurboJPEG 3 library (check :func:`available`).
        ValueError: corrupt or truncated data (or a libjpeg warning, with ``stop_on_warning``).
    """
    lib = _library()[0]
    if lib is None:
        raise RuntimeError("no TurboJPEG 3 library found")
    top, left, bottom, right = box
    handle = lib.tj3Init(_TJINIT_DECOMPRESS)
    if not handle:
        raise MemoryError("tj3Init failed")
    try:
        def check(status: int) -> None:
            # Without stop-on-warning a warning still fails the call, with
            # TJERR_WARNING: the output is whole then.
            if status != 0 and (stop_on_warning or lib.tj3GetErrorCode(handle) != _TJERR_WARNING):
                raise ValueError(lib.tj3GetErrorStr(handle).decode(errors="replace"))

        lib.tj3Set(handle, _TJPARAM_STOPONWARNING, int(stop_on_warning))
        lib.tj3Set(handle, _TJPARAM_FASTDCT, int(fastdct))
        lib.tj3Set(handle, _TJPARAM_FASTUPSAMPLE, int(fastupsample))
        check(lib.tj3DecompressHeader(handle, data, len(data)))
        check(lib.tj3SetScalingFactor(handle, _ScalingFactor(1, factor)))
        mcu_width = _MCU_WIDTH.get(lib.tj3Get(handle, _TJPARAM_SUBSAMP))
        if mcu_width is None:
            # Unusual subsampling: libjpeg-turbo cannot crop it; decode the
            # whole (scaled) image and slice.
            full_h = -(-lib.tj3Get(handle, _TJPARAM_JPEGHEIGHT) // factor)
            full_w = -(-lib.tj3Get(handle, _TJPARAM_JPEGWIDTH) // factor)
            out = np.empty((full_h, full_w, 3), dtype=np.uint8)
            check(lib.tj3Decompress8(handle, data, len(data), out.ctypes.data, full_w * 3, _TJPF_RGB))
            return out[top:bottom, left:right]
        # The region's left edge must fall on a (scaled) MCU boundary. And
        # libjpeg-turbo's smooth chroma upsampling treats the region's sides
        # as the image's: with subsampled chroma the columns next to them
        # would differ from a whole-image decode. So decode one more MCU on
        # each side (within the image), from a boundary, then slice.
        mcu = max(1, mcu_width // factor)
        full_w = -(-lib.tj3Get(handle, _TJPARAM_JPEGWIDTH) // factor)
        x0 = max(0, left - left % mcu - mcu)
        width, height = min(full_w, right + mcu) - x0, bottom - top
        check(lib.tj3SetCroppingRegion(handle, _Region(x0, top, width, height)))
        out = np.empty((height, width, 3), dtype=np.uint8)
        check(lib.tj3Decompress8(handle, data, len(data), out.ctypes.data, width * 3, _TJPF_RGB))
    finally:
        lib.tj3Destroy(handle)
    return out[:, left - x0 : right - x0]
