"""NumPy ``.npy`` / ``.npz`` files parsed from memory, as views instead of copies.

:func:`load_npy` and :func:`load_npz` take the bytes of a file already in
memory (bytes, mmap, a shard's memoryview) and return arrays that view those
bytes; ``numpy.load`` would copy them through a file object. Pure functions of
their arguments: safe to call from many threads at once.
"""

from __future__ import annotations

import ast
import io
import math
import struct
import zipfile
import zlib
from typing import Any

import numpy as np

__all__ = ["load_npy", "load_npz"]

_NPY_MAGIC = b"\x93NUMPY"


def _as_bytes_view(data: Any, what: str) -> memoryview:
    try:
        view = memoryview(data)
    except TypeError:
        raise TypeError(f"{what} needs a bytes-like object, got {type(data).__name__}") from None
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    return view


def load_npy(data: Any) -> np.ndarray:
    """Parse an in-memory ``.npy`` file without copying its data.

    Args:
        data: the file's bytes (bytes, bytearray, memoryview, mmap, ...).

    Returns:
        An array viewing ``data`` (read-only when ``data`` is); equal to
        ``numpy.load(io.BytesIO(data))``.

    Raises:
        TypeError: ``data`` is not a bytes-like object.
        ValueError: bad magic, unsupported version, malformed header,
            truncated data, or an object dtype (needs pickle, refused as
            ``numpy.load(allow_pickle=False)`` refuses it).
    """
    view = _as_bytes_view(data, "load_npy")
    return _parse_npy(view, "npy data")


def _parse_npy(view: memoryview, what: str) -> np.ndarray:
    n = view.nbytes
    if view[:6].tobytes() != _NPY_MAGIC:
        raise ValueError(f"{what}: not an NPY file (expected magic {_NPY_MAGIC!r}, got {view[:6].tobytes()!r})")
    if n < 10:
        raise ValueError(f"{what}: truncated NPY header ({n} bytes, a header needs at least 10)")
    major, minor = view[6], view[7]
    if minor != 0:  # numpy.load knows (1, 0), (2, 0) and (3, 0) only
        raise ValueError(f"{what}: unsupported NPY format version {major}.{minor}")
    if major == 1:
        (hlen,), start, encoding = struct.unpack("<H", view[8:10]), 10, "latin1"
    elif major in (2, 3):
        if n < 12:
            raise ValueError(f"{what}: truncated NPY header")
        (hlen,), start = struct.unpack("<I", view[8:12]), 12
        encoding = "utf8" if major == 3 else "latin1"
    else:
        raise ValueError(f"{what}: unsupported NPY format version {major}.{minor}")
    if start + hlen > n:
        raise ValueError(f"{what}: truncated NPY header (needs {start + hlen} bytes, has {n})")
    try:
        header = ast.literal_eval(view[start:start + hlen].tobytes().decode(encoding))
    except (SyntaxError, ValueError, UnicodeDecodeError, MemoryError, RecursionError, TypeError) as e:
        raise ValueError(f"{what}: malformed NPY header ({e})") from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise ValueError(f"{what}: malformed NPY header (need keys descr, fortran_order, shape): {header!r}")
    shape, fortran = header["shape"], header["fortran_order"]
    if not isinstance(shape, tuple) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ValueError(f"{what}: malformed NPY header (bad shape {shape!r})")
    if not isinstance(fortran, bool):
        raise ValueError(f"{what}: malformed NPY header (bad fortran_order {fortran!r})")
    try:
        dtype = np.lib.format.descr_to_dtype(header["descr"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what}: malformed NPY header (bad descr {header['descr']!r}: {e})") from None
    if dtype.hasobject:
        raise ValueError(f"{what}: object arrays need pickle, which load_npy refuses "
                         f"(like numpy.load(allow_pickle=False))")
    count = math.prod(shape)
    offset = start + hlen
    needed = count * dtype.itemsize
    if n - offset < needed:
        raise ValueError(f"{what}: truncated NPY data (shape {shape} {dtype} needs {needed} bytes, "
                         f"has {n - offset})")
    if dtype.itemsize == 0:  # np.frombuffer refuses empty items (numpy.load does not)
        flat = np.empty(count, dtype=dtype)
    else:
        flat = np.frombuffer(view, dtype=dtype, count=count, offset=offset)
    if fortran:
        return flat.reshape(shape[::-1]).T
    return flat.reshape(shape)


class _BufferFile(io.RawIOBase):
    """A seekable read-only file over a memoryview (io.BytesIO would copy it)."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._view.nbytes}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        chunk = self._view[self._pos:self._pos + len(buffer)]
        k = chunk.nbytes
        memoryview(buffer).cast("B")[:k] = chunk
        self._pos += k
        return k


def load_npz(data: Any) -> dict[str, Any]:
    """Parse an in-memory ``.npz`` file.

    Stored (uncompressed) members are returned as views of ``data``;
    deflated members are inflated once (zlib releases the GIL) and parsed.

    Args:
        data: the file's bytes (bytes, bytearray, memoryview, mmap, ...).

    Returns:
        ``{name: array}`` with the ``.npy`` suffix stripped, like
        ``numpy.load``'s keys; members that are not NPY data (no NPY magic,
        whatever their name) map to their raw bytes, as ``numpy.load`` gives
        them. Every member's CRC is checked, as ``numpy.load`` does.

    Raises:
        TypeError: ``data`` is not a bytes-like object.
        ValueError: not a zip file, truncated or corrupt members, encrypted
            members, or any :func:`load_npy` error (naming the member).
    """
    view = _as_bytes_view(data, "load_npz")
    try:
        archive = zipfile.ZipFile(_BufferFile(view))
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise ValueError(f"npz data: not a zip archive or truncated ({e})") from None
    out: dict[str, Any] = {}
    with archive:
        infos = archive.infolist()
        names = {info.filename for info in infos}
        # As numpy.load: the key is the name without ".npy" (a member named
        # exactly so wins over "<name>.npy"), and a member is an array when it
        # starts with the NPY magic, whatever its name.
        for info in infos:
            member = info.filename
            key = member[:-4] if member.endswith(".npy") else member
            if key != member and key in names:
                continue
            raw = _member_bytes(archive, info, view)
            if raw[:len(_NPY_MAGIC)].tobytes() == _NPY_MAGIC:
                out[key] = _parse_npy(raw, f"npz member {member!r}")
            else:
                out[key] = raw.tobytes()
    return out


def _member_bytes(archive: zipfile.ZipFile, info: zipfile.ZipInfo, view: memoryview) -> memoryview:
    what = f"npz member {info.filename!r}"
    if info.flag_bits & 0x1:
        raise ValueError(f"{what}: encrypted members are not supported")
    local = info.header_offset
    if local + 30 > view.nbytes or view[local:local + 4].tobytes() != b"PK\x03\x04":
        raise ValueError(f"{what}: bad local file header (corrupt or truncated archive)")
    name_len, extra_len = struct.unpack("<HH", view[local + 26:local + 30])
    start = local + 30 + name_len + extra_len
    end = start + info.compress_size
    if end > view.nbytes:
        raise ValueError(f"{what}: truncated (needs {end} bytes, archive has {view.nbytes})")
    if info.compress_type == zipfile.ZIP_STORED:
        stored = view[start:end]  # a view: no copy
        # numpy.load checks the CRC of every member (zipfile does); so does this.
        if info.compress_size != info.file_size or zlib.crc32(stored) != info.CRC:
            raise ValueError(f"{what}: corrupt data (size or CRC mismatch)")
        return stored
    if info.compress_type == zipfile.ZIP_DEFLATED:
        try:
            raw = zlib.decompress(view[start:end], -zlib.MAX_WBITS, max(info.file_size, 1))
        except zlib.error as e:
            raise ValueError(f"{what}: corrupt deflate data ({e})") from None
    else:  # bzip2 / lzma: rare in .npz; let zipfile handle them
        try:
            raw = archive.read(info)
        except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError) as e:
            raise ValueError(f"{what}: {e}") from None
    if len(raw) != info.file_size or zlib.crc32(raw) != info.CRC:
        raise ValueError(f"{what}: corrupt data (size or CRC mismatch)")
    return memoryview(raw)
