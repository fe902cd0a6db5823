"""Image decoding and array loading for data-loading threads.

* :func:`decode_image` turns a path or bytes into a :class:`~threadloader.Frame`,
  optionally cropped and resized. JPEGs go through simplejpeg (libjpeg-turbo,
  releases the GIL), decoded at 1/2, 1/4 or 1/8 scale in the DCT domain
  when the output is small enough (see ``reducing_gap``); everything else (PNG, palette, grey, RGBA, CMYK, ...) goes
  through Pillow and is converted to RGB as torchvision's ``pil_loader`` does.
  Resizing uses torch's antialiased bilinear uint8 kernel (matches Pillow's
  resize, which torchvision's ``Resize`` uses on PIL images, to +-1 level).
* :class:`RandomResizedCropLoader` picks a ``RandomResizedCrop`` box from the
  image header, before any pixel is decoded, and decodes at the smallest DCT
  scale the crop allows.
* :func:`load_npy` / :func:`load_npz` parse NumPy files held in memory and
  return views of the buffer instead of copies.

Everything here is a pure function of its arguments (no module-level mutable
state), so it is safe to call from many threads at once.
"""

from __future__ import annotations

import ast
import io
import math
import os
import struct
import zipfile
import zlib
from typing import Any, Mapping, Sequence, Union

import numpy as np
import torch

from . import _turbojpeg
from ._torch_compat import resize_uint8_channels_last
from .frames import Frame

__all__ = [
    "ImageDecodeError",
    "Source",
    "decode_image",
    "image_size",
    "random_resized_crop_params",
    "RandomResizedCropLoader",
    "load_npy",
    "load_npz",
]

#: What the image functions accept: a path or the encoded bytes.
Source = Union[str, os.PathLike, bytes, bytearray, memoryview]


class ImageDecodeError(ValueError):
    """An image could not be decoded; the message names the source and why."""


# --- sources -------------------------------------------------------------------

def _read_source(source: Any) -> tuple[Any, str]:
    """The encoded bytes of ``source`` and a name for error messages."""
    if isinstance(source, (str, os.PathLike)):
        name = os.fsdecode(source)
        # FileNotFoundError / IsADirectoryError / PermissionError name the path.
        with open(source, "rb") as f:
            return f.read(), repr(name)
    if isinstance(source, (bytes, bytearray, memoryview, np.ndarray)):
        data = memoryview(source)
        if data.ndim != 1 or data.itemsize != 1:
            data = data.cast("B")
        return data, f"<bytes of length {data.nbytes}>"
    raise TypeError(f"expected a path or bytes-like object, got {type(source).__name__}")


def _is_jpeg(data: Any) -> bool:
    return len(data) >= 3 and bytes(data[:3]) == b"\xff\xd8\xff"


def _fail(name: str, reason: str) -> ImageDecodeError:
    return ImageDecodeError(f"cannot decode image {name}: {reason}")


# --- geometry ------------------------------------------------------------------

def _pair(size: int | Sequence[int], what: str) -> tuple[int, int]:
    if isinstance(size, int):
        pair = (size, size)
    else:
        pair = tuple(int(s) for s in size)
        if len(pair) == 1:
            pair = (pair[0], pair[0])
    if len(pair) != 2 or pair[0] <= 0 or pair[1] <= 0:
        raise ValueError(f"{what} must be a positive int or (height, width), got {size!r}")
    return pair  # type: ignore[return-value]


class _CropOutsideImage(ValueError):
    pass


def _check_crop(crop: Sequence[int], height: int, width: int, name: str) -> tuple[int, int, int, int]:
    top, left, h, w = (int(v) for v in crop)
    if h <= 0 or w <= 0 or top < 0 or left < 0 or top + h > height or left + w > width:
        raise _CropOutsideImage(
            f"crop (top={top}, left={left}, height={h}, width={w}) does not fit in image {name} "
            f"of size {height}x{width} (HxW)"
        )
    return top, left, h, w


def _dct_factor(crop_hw: tuple[int, int], size: tuple[int, int], reducing_gap: float) -> int:
    # libjpeg-turbo scales by n/8; only 1/2, 1/4 and 1/8 have SIMD IDCTs, so
    # those are the only ones used. As Pillow's ``reducing_gap``: the scaled
    # crop stays >= reducing_gap x size, so the final antialiased resize still
    # does real filtering and the crop-edge rounding (< 1/2 scaled pixel) is
    # < 1/(2 x reducing_gap) output pixel.
    for factor in (8, 4, 2):
        if crop_hw[0] >= size[0] * factor * reducing_gap and crop_hw[1] >= size[1] * factor * reducing_gap:
            return factor
    return 1


# --- resize --------------------------------------------------------------------

def _resize(arr: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Antialiased bilinear resize of HWC uint8 pixels to ``size`` (h, w)."""
    if arr.shape[:2] == size:
        return arr
    out = torch.empty((1, size[0], size[1], arr.shape[2]), dtype=torch.uint8)
    resize_uint8_channels_last(torch.from_numpy(arr).unsqueeze(0), size, out)
    return out[0].numpy()


# --- decoders ------------------------------------------------------------------

def _edge(x: float) -> int:
    return int(math.floor(x + 0.5))


def _scaled_box(crop: tuple[int, int, int, int], sy: float, sx: float) -> tuple[int, int, int, int]:
    """Map a source crop ``(top, left, height, width)`` into an image decoded at scale ``(sy, sx)``.

    At scale 1/f each decoded pixel is one f x f source block, so a source
    edge y maps to y / f exactly; fractional edges round to the nearest pixel
    and the box keeps at least one pixel per side.

    Returns:
        ``(top, left, bottom, right)`` in the decoded image.
    """
    top, left, h, w = crop
    t, b = _edge(top * sy), _edge((top + h) * sy)
    l, r = _edge(left * sx), _edge((left + w) * sx)
    return t, l, max(b, t + 1), max(r, l + 1)


def _decode_simplejpeg(
    data: Any, name: str, header: tuple, size: tuple[int, int] | None, crop: Sequence[int] | None,
    reducing_gap: float | None, fastdct: bool, fastupsample: bool,
) -> np.ndarray:
    import simplejpeg

    height, width = header[0], header[1]
    top, left, ch, cw = _check_crop(crop, height, width, name) if crop is not None else (0, 0, height, width)
    factor = _dct_factor((ch, cw), size, reducing_gap) if (size is not None and reducing_gap) else 1
    if crop is not None and _turbojpeg.available():
        # Decode only the crop (rows above it are skipped, rows below never
        # read, columns outside it not transformed), at the same scale and
        # with the same edges as the whole-image path below.
        box = _scaled_box((top, left, ch, cw), -(-height // factor) / height, -(-width // factor) / width)
        raw = data if isinstance(data, bytes) else bytes(data)
        # libjpeg stops reading after the crop's last row: check the end of
        # the file here, so that a truncated file is refused as it is below.
        if not _complete(raw, "JPEG"):
            raise _fail(name, "corrupt or truncated JPEG (no end-of-image marker after the scan)")
        try:
            return _turbojpeg.decode_region(raw, factor, box, fastdct=fastdct, fastupsample=fastupsample)
        except ValueError as e:
            raise _fail(name, f"corrupt or truncated JPEG ({e})") from e
    kwargs: dict[str, Any] = {}
    if factor > 1:
        kwargs = dict(min_height=-(-height // factor), min_width=-(-width // factor))
    try:
        # strict=True turns libjpeg's recoverable warnings (truncated data,
        # corrupt segments) into errors: never return a half-decoded image.
        arr = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=fastdct, fastupsample=fastupsample,
                                     strict=True, **kwargs)
    except ValueError as e:
        raise _fail(name, f"corrupt or truncated JPEG ({e})") from e
    if factor > 1 or crop is not None:
        if arr.shape[:2] == (-(-height // factor), -(-width // factor)):
            sy = sx = 1.0 / factor
        else:  # pragma: no cover - libjpeg chose another scale
            sy, sx = arr.shape[0] / height, arr.shape[1] / width
        t, l, b, r = _scaled_box((top, left, ch, cw), sy, sx)
        arr = arr[t:b, l:r]
    return arr


def _complete(data: Any, fmt: str | None) -> bool:
    """Whether a file Pillow will decode has its end marker (truncation check).

    Pillow can be told globally (``ImageFile.LOAD_TRUNCATED_IMAGES``) to return
    truncated images padded with grey; this check does not depend on it.
    """
    raw = bytes(data) if not isinstance(data, bytes) else data
    if fmt in ("JPEG", "MPO"):
        # The last end-of-image marker must follow the last start-of-scan
        # marker (entropy-coded data cannot contain either).
        return raw.rfind(b"\xff\xd9") > raw.rfind(b"\xff\xda")
    if fmt == "PNG":
        return raw.rfind(b"IEND") > raw.rfind(b"IDAT")
    return True


def _decode_pillow(data: Any, name: str, crop: Sequence[int] | None) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:
            if not _complete(data, im.format):
                raise _fail(name, f"truncated {im.format} data (no end marker)")
            if crop is not None:
                top, left, h, w = _check_crop(crop, im.height, im.width, name)
                im.load()
                im = im.crop((left, top, left + w, top + h))
            # Same conversion as torchvision's pil_loader (alpha dropped,
            # palette expanded, CMYK/grey converted by Pillow).
            rgb = im.convert("RGB")
            return np.array(rgb)  # writable copy, so torch can wrap it
    except (ImageDecodeError, _CropOutsideImage):
        raise
    except UnidentifiedImageError as e:
        raise _fail(name, "not an image, or a format Pillow cannot read") from e
    except ValueError as e:
        raise _fail(name, str(e) or type(e).__name__) from e
    except (OSError, SyntaxError, EOFError, struct.error, Image.DecompressionBombError) as e:
        raise _fail(name, str(e) or type(e).__name__) from e


def _decode_data(
    data: Any, name: str, size: tuple[int, int] | None, crop: Sequence[int] | None,
    reducing_gap: float | None, fastdct: bool, fastupsample: bool,
) -> Frame:
    if len(data) == 0:
        raise _fail(name, "empty file")
    arr = None
    if _is_jpeg(data):
        header = _jpeg_header(data, name)
        if header[2] not in ("CMYK", "YCCK"):  # Adobe CMYK needs Pillow's inversion handling
            arr = _decode_simplejpeg(data, name, header, size, crop, reducing_gap, fastdct, fastupsample)
    if arr is None:
        arr = _decode_pillow(data, name, crop)
    if size is not None:
        arr = _resize(arr, size)
    return Frame(arr)


def _jpeg_header(data: Any, name: str) -> tuple:
    import simplejpeg

    try:
        return simplejpeg.decode_jpeg_header(data)
    except ValueError as e:
        raise _fail(name, f"corrupt JPEG header ({e})") from e


def decode_image(
    source: Source,
    *,
    size: int | tuple[int, int] | None = None,
    crop: tuple[int, int, int, int] | None = None,
    reducing_gap: float | None = 2.0,
    fastdct: bool = False,
    fastupsample: bool = False,
) -> Frame:
    """Decode an image file to RGB pixels, optionally cropped and resized.

    Works as an ``ImageFolder`` loader:
    ``ImageFolder(root, loader=functools.partial(decode_image, size=(224, 224)))``.

    Args:
        source: a path, or the encoded bytes (bytes, bytearray, memoryview).
        size: output ``(height, width)`` (an int means square). Resized with
            antialiased bilinear, like torchvision's ``Resize`` on PIL images.
            None keeps the decoded size.
        crop: ``(top, left, height, width)`` in source pixels, applied before
            ``size``; must lie inside the image.
        reducing_gap: as Pillow's ``reducing_gap``: with ``size``, a JPEG is
            decoded at 1/2, 1/4 or 1/8 scale (in the DCT domain: much cheaper)
            when the (cropped) image stays at least ``reducing_gap`` times
            ``size`` at that scale; the antialiased resize does the rest.
            1.0 is fastest, larger is closer to a full-resolution resize,
            None always decodes at full resolution.
        fastdct: simplejpeg's faster, slightly less accurate IDCT.
        fastupsample: simplejpeg's faster chroma upsampling.

    Returns:
        A :class:`~threadloader.Frame` of ``(H, W, 3)`` uint8 RGB pixels.

    Raises:
        FileNotFoundError: ``source`` is a path that does not exist.
        ImageDecodeError: empty, truncated, corrupt or non-image data (the
            message names the file, or ``<bytes of length N>``).
        ValueError: a bad ``size`` or a ``crop`` outside the image.
    """
    data, name = _read_source(source)
    return _decode_data(data, name, _pair(size, "size") if size is not None else None, crop,
                        reducing_gap, fastdct, fastupsample)


def image_size(source: Source) -> tuple[int, int]:
    """``(height, width)`` of an encoded image, read from its header only.

    Raises:
        FileNotFoundError: missing path.
        ImageDecodeError: not a readable image.
    """
    data, name = _read_source(source)
    return _size_of(data, name)


def _size_of(data: Any, name: str) -> tuple[int, int]:
    if len(data) == 0:
        raise _fail(name, "empty file")
    if _is_jpeg(data):
        h, w = _jpeg_header(data, name)[:2]
        return h, w
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:  # lazy: reads the header only
            return im.height, im.width
    except UnidentifiedImageError as e:
        raise _fail(name, "not an image, or a format Pillow cannot read") from e
    except (OSError, SyntaxError, ValueError, EOFError, struct.error) as e:
        raise _fail(name, str(e) or type(e).__name__) from e


# --- random resized crop -------------------------------------------------------

def random_resized_crop_params(
    height: int,
    width: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
    generator: torch.Generator | None = None,
) -> tuple[int, int, int, int]:
    """A ``RandomResizedCrop`` box for an image of the given size.

    The same algorithm and random draws as torchvision's
    ``RandomResizedCrop.get_params`` (with ``generator=None`` and the same
    global seed it returns the same box), but needing only the image size.

    Returns:
        ``(top, left, height, width)``.
    """
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1], generator=generator).item()
        aspect_ratio = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1], generator=generator)).item()
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, size=(1,), generator=generator).item())
            left = int(torch.randint(0, width - w + 1, size=(1,), generator=generator).item())
            return top, left, h, w
    # Fallback: central crop with the aspect ratio clamped into range.
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        h, w = height, width
    return (height - h) // 2, (width - w) // 2, h, w


def _snap(crop: tuple[int, int, int, int], f: int, height: int, width: int) -> tuple[int, int, int, int]:
    """Move a crop box's edges to multiples of ``f`` (image edges count as aligned)."""
    top, left, h, w = crop

    def snap(lo: int, hi: int, limit: int) -> tuple[int, int]:
        a = min(_edge(lo / f) * f, limit)
        b = limit if hi == limit else min(_edge(hi / f) * f, limit)
        if b - a < f:  # keep at least one scaled pixel
            b = min(a + f, limit)
            a = min(a, b - 1)
        return a, b

    t, b = snap(top, top + h, height)
    l, r = snap(left, left + w, width)
    return t, l, b - t, r - l


class RandomResizedCropLoader:
    """Loader doing torchvision's ``RandomResizedCrop`` while decoding.

    The crop box is drawn from the image size in the header, before decoding,
    so a JPEG can be decoded at the smallest DCT scale (1/2, 1/4, 1/8) whose
    crop is still at least ``size``; then the box is cut out and resized.
    Same pixels as full decode + crop + resize to within a few levels.

    Use it as an ``ImageFolder`` loader:
    ``ImageFolder(root, loader=RandomResizedCropLoader(224))``.

    Args:
        size: output ``(height, width)``, or an int for a square.
        scale: range of the crop area relative to the image area.
        ratio: range of the crop aspect ratio (width / height).
        generator: torch generator for the crop draws. Leave None in
            ThreadDataLoader workers: each worker thread's own generator
            (``torch.random.thread_safe_generator()``) is used then, and the
            global RNG elsewhere (as torchvision does). A generator passed here
            is shared by every thread that calls the loader.
        reducing_gap, fastdct, fastupsample: as for :func:`decode_image`.
    """

    def __init__(
        self,
        size: int | tuple[int, int],
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
        *,
        generator: torch.Generator | None = None,
        reducing_gap: float | None = 2.0,
        fastdct: bool = False,
        fastupsample: bool = False,
    ) -> None:
        self.size = _pair(size, "size")
        if scale[0] > scale[1] or ratio[0] > ratio[1]:
            raise ValueError(f"scale and ratio must be (min, max), got {scale!r} and {ratio!r}")
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.generator = generator
        self.reducing_gap = reducing_gap
        self.fastdct = fastdct
        self.fastupsample = fastupsample

    def _generator(self) -> torch.Generator | None:
        if self.generator is not None:
            return self.generator
        thread_safe = getattr(torch.random, "thread_safe_generator", None)
        return thread_safe() if thread_safe is not None else None

    def get_params(self, height: int, width: int) -> tuple[int, int, int, int]:
        """Draw a crop box ``(top, left, height, width)`` for an image size."""
        return random_resized_crop_params(height, width, self.scale, self.ratio, self._generator())

    def __call__(self, source: Source) -> Frame:
        """Decode ``source`` (path or bytes) with a random resized crop.

        Raises:
            FileNotFoundError, ImageDecodeError: as :func:`decode_image`.
        """
        return self.sample(source)[0]

    def sample(self, source: Source) -> tuple[Frame, tuple[int, int, int, int]]:
        """Like calling the loader, but also return the crop box used.

        When the JPEG is decoded at scale 1/f, the drawn box is snapped to
        multiples of f (moving each edge by < f/2 source pixels, which does
        not change the crop distribution in any way that matters) so that it
        falls exactly on scaled pixels. The result is then full decode +
        ``crop(box)`` + resize, up to the DCT-scaling filter (a few levels).

        Returns:
            ``(frame, (top, left, height, width))`` in source pixels.
        """
        data, name = _read_source(source)
        height, width = _size_of(data, name)
        crop = self.get_params(height, width)
        if self.reducing_gap and _is_jpeg(data):
            factor = _dct_factor(crop[2:], self.size, self.reducing_gap)
            if factor > 1:
                crop = _snap(crop, factor, height, width)
        frame = _decode_data(data, name, self.size, crop, self.reducing_gap, self.fastdct, self.fastupsample)
        return frame, crop

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(size={self.size}, scale={self.scale}, ratio={self.ratio}, "
                f"reducing_gap={self.reducing_gap})")


# --- NumPy files ---------------------------------------------------------------

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
        ``numpy.load``'s keys; members that are not ``.npy`` files map to
        their raw bytes, as ``numpy.load`` gives them.

    Raises:
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
        for info in archive.infolist():
            member = info.filename
            raw = _member_bytes(archive, info, view)
            if member.endswith(".npy"):
                out[member[:-4]] = _parse_npy(raw, f"npz member {member!r}")
            else:
                out[member] = raw.tobytes()
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
        return view[start:end]  # a view: no copy
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
