"""Image decoding: a path or encoded bytes to a :class:`~threadloader.Frame`.

JPEGs go through simplejpeg (libjpeg-turbo, releases the GIL; leanjpeg_simple on a
free-threaded Python, see ``_codec``), decoded at 1/2,
1/4 or 1/8 scale in the DCT domain when the output is small enough (see
``reducing_gap``), and only the crop when one is asked for and TurboJPEG 3 is
available. Everything else (PNG, palette, grey, RGBA, CMYK, ...) goes through
Pillow and is converted to RGB as torchvision's ``pil_loader`` does.

With ``size``, the frame holds the decoded pixels and the pending size: the
antialiased resize (torch's uint8 kernel, Pillow's ``resize`` to +-1 level)
runs when the frame is collated -- straight into its slot of the batch -- or
first read. Safe to call from many threads at once: the only module-level
state is the decoders' buffer pool (``threadloader.images.buffers``), which is
thread-safe.
"""

from __future__ import annotations

import contextlib
import errno
import io
import math
import numbers
import os
import stat
import struct
import warnings
from typing import Any, Callable, Iterator, Sequence, Union

import numpy as np

from . import _jpeg_stream, _turbojpeg
from . import frames as _frames
from ._codec import jpeg
from .buffers import decode_pool
from .frames import Frame, _deferred

__all__ = ["ImageDecodeError", "Source", "decode_image", "image_size"]

Source = Union[str, os.PathLike, bytes, bytearray, memoryview]


class ImageDecodeError(ValueError):
    """An image could not be decoded; the message names the source and why."""


# --- sources -------------------------------------------------------------------

def _read_file(path: Any) -> bytes:
    """The whole file at ``path``, in as few system calls as the kernel allows.

    ``open(path, "rb").read()`` makes nine (isatty, seeks, a second stat...),
    and each releases and retakes the GIL: with many worker threads every
    release is a hand-off. Here: open, fstat, read, read (end of file),
    close. FileNotFoundError / IsADirectoryError / PermissionError name the
    path, as ``open`` does.
    """
    fd = os.open(path, _OPEN_FLAGS)
    try:
        st = _fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fsdecode(path))
        size = st.st_size
        try:
            # One byte more than the size, so that a file that grew is not cut.
            chunks = [os.read(fd, size + 1)]
            while True:  # to the end of the file, whatever the size said
                more = os.read(fd, max(size, 1 << 16))
                if not more:
                    break
                chunks.append(more)
        except OSError as e:
            raise OSError(e.errno, e.strerror, os.fsdecode(path)) from e
    finally:
        os.close(fd)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
_fstat = os.fstat  # a name of this module's own, so that a test can make the size stale


def _read_source(source: Any) -> Any:
    """The encoded bytes of ``source`` (a path or a bytes-like object)."""
    if type(source) is bytes:  # the common in-memory case, first and cheapest
        return source
    if isinstance(source, (str, os.PathLike)):
        return _read_file(source)
    if isinstance(source, (bytes, bytearray, memoryview, np.ndarray)):
        data = memoryview(source)
        if not data.c_contiguous:
            # The decoders read the buffer's memory as one run of bytes: a
            # strided or reversed view must become its logical bytes first
            # (else they would read memory outside it).
            return data.tobytes()
        if data.ndim != 1 or data.itemsize != 1:
            data = data.cast("B")
        return data
    raise TypeError(f"expected a path or bytes-like object, got {type(source).__name__}")


def _describe(source: Any) -> str:
    """``source`` as error messages name it: the path's repr, or ``<bytes of length N>``.

    Built only when a message needs it: the successful path formats nothing.
    """
    if isinstance(source, (str, os.PathLike)):
        return repr(os.fsdecode(source))
    return f"<bytes of length {memoryview(source).nbytes}>"


def _is_jpeg(data: Any) -> bool:
    return data[:3] == b"\xff\xd8\xff" if type(data) is bytes else (
        len(data) >= 3 and bytes(data[:3]) == b"\xff\xd8\xff")


#: Pillow's format names of files that start with these bytes.
_SIGNATURES = (
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
)


def _signature_format(data: Any) -> str | None:
    """The format of a PNG, GIF, TIFF or WebP file from its first bytes, or None (Pillow identifies it)."""
    head = bytes(data[:12])
    for signature, fmt in _SIGNATURES:
        if head.startswith(signature):
            return fmt
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    return None


def _fail(source: Any, reason: str) -> ImageDecodeError:
    return ImageDecodeError(f"cannot decode image {_describe(source)}: {reason}")


# --- geometry ------------------------------------------------------------------

def _is_int(v: Any) -> bool:
    # Python and NumPy integers; not bool (True is no size) and not floats
    # (1.7 would be truncated silently).
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def _pair(size: int | Sequence[int], what: str) -> tuple[int, int]:
    if type(size) is tuple and len(size) == 2:  # fast path: the usual (h, w) of ints
        h, w = size
        if type(h) is int and type(w) is int and h > 0 and w > 0:
            return size  # type: ignore[return-value]
    if _is_int(size):
        items: tuple = (size, size)
    else:
        try:
            items = tuple(size)  # type: ignore[arg-type]
        except TypeError:
            items = ()
        if len(items) == 1:
            items = (items[0], items[0])
    if len(items) != 2 or not all(_is_int(v) and v > 0 for v in items):
        raise ValueError(f"{what} must be a positive int or (height, width), got {size!r}")
    return int(items[0]), int(items[1])


def _crop_box(crop: Any) -> tuple[int, int, int, int]:
    """``crop`` as four ints, checked before anything is decoded (same error for every format)."""
    try:
        box = tuple(crop)
    except TypeError:
        box = ()
    if len(box) != 4 or not all(_is_int(v) for v in box):
        raise ValueError(f"crop must be (top, left, height, width) integers, got {crop!r}")
    return int(box[0]), int(box[1]), int(box[2]), int(box[3])


class _CropOutsideImage(ValueError):
    """Internal: lets the decoders tell a bad crop from a decoder's ValueError.

    ``decode_image`` re-raises it as a plain ValueError (its documented type).
    """


def _check_crop(crop: Sequence[int], height: int, width: int, src: Any) -> tuple[int, int, int, int]:
    top, left, h, w = (int(v) for v in crop)
    if h <= 0 or w <= 0 or top < 0 or left < 0 or top + h > height or left + w > width:
        raise _CropOutsideImage(
            f"crop (top={top}, left={left}, height={h}, width={w}) does not fit in image {_describe(src)} "
            f"of size {height}x{width} (HxW)"
        )
    return top, left, h, w


def _check_reducing_gap(reducing_gap: float | None) -> float | None:
    # Below 1 the DCT scale would drop below the output size (and upscale).
    if reducing_gap is None or (type(reducing_gap) is float and reducing_gap >= 1.0):  # per image: cheap first
        return reducing_gap
    if not (isinstance(reducing_gap, numbers.Real) and reducing_gap >= 1.0):
        raise ValueError("reducing_gap must be 1.0 or greater")  # Pillow's message
    return reducing_gap


def _dct_factor(crop_h: int, crop_w: int, size: tuple[int, int], reducing_gap: float) -> int:
    # libjpeg-turbo scales by n/8; only 1/2, 1/4 and 1/8 have SIMD IDCTs, so
    # those are the only ones used. As Pillow's ``reducing_gap``: the scaled
    # crop stays >= reducing_gap x size, so the final antialiased resize still
    # does real filtering and the crop-edge rounding (< 1/2 scaled pixel) is
    # < 1/(2 x reducing_gap) output pixel.
    for factor in (8, 4, 2):
        if crop_h >= size[0] * factor * reducing_gap and crop_w >= size[1] * factor * reducing_gap:
            return factor
    return 1


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
    data: Any, src: Any, header: tuple, size: tuple[int, int] | None, crop: Sequence[int] | None,
    reducing_gap: float | None, fastdct: bool, fastupsample: bool,
) -> np.ndarray:
    height, width = header[0], header[1]
    if crop is None:
        top = left = 0
        ch, cw = height, width
    else:
        top, left, ch, cw = _check_crop(crop, height, width, src)
    factor = _dct_factor(ch, cw, size, reducing_gap) if (size is not None and reducing_gap) else 1
    # libjpeg-turbo can neither scale nor crop a lossless JPEG: asked to, it
    # writes full-size rows into the scaled buffer (a heap overflow), or
    # refuses the crop. Those decode whole, at full scale, and are sliced.
    lossless = (factor > 1 or crop is not None) and _jpeg_stream.is_lossless(data)
    if lossless:
        factor = 1
    if crop is not None and not lossless and _turbojpeg.available():
        # Decode only the crop (rows above it are skipped, rows below never
        # read, columns outside it not transformed), at the same scale and
        # with the same edges as the whole-image path below.
        box = _scaled_box((top, left, ch, cw), 1.0 / factor, 1.0 / factor)
        raw = data if isinstance(data, bytes) else bytes(data)
        # libjpeg stops reading after the crop's last row: check the end of
        # the file here, so that a truncated file is refused as it is below.
        if not _jpeg_stream.is_complete(raw):
            raise _fail(src, "corrupt or truncated JPEG (no end-of-image marker after the scan)")
        return _strict_unless_harmless(
            raw, src, lambda strict: _turbojpeg.decode_region(raw, factor, box, fastdct=fastdct,
                                                         fastupsample=fastupsample, stop_on_warning=strict))
    out_h, out_w = scaled_dims(height, width, factor)
    # min_height/min_width <= 0 mean full scale.
    arr = _strict_unless_harmless(data, src, lambda strict: jpeg.decode_jpeg(
        data, colorspace="RGB", fastdct=fastdct, fastupsample=fastupsample,
        min_height=out_h if factor > 1 else 0, min_width=out_w if factor > 1 else 0,
        buffer=decode_pool.take_bytes(out_h * out_w * 3), strict=strict))
    if factor > 1 or crop is not None:
        if arr.shape[:2] == (out_h, out_w):
            sy = sx = 1.0 / factor
        else:  # pragma: no cover - libjpeg chose another scale
            sy, sx = arr.shape[0] / height, arr.shape[1] / width
        t, l, b, r = _scaled_box((top, left, ch, cw), sy, sx)
        arr = arr[t:b, l:r]
    return arr


def _strict_unless_harmless(data: Any, src: Any, decode: Callable[[bool], np.ndarray]) -> np.ndarray:
    """``decode(strict=True)``, where libjpeg's warnings are errors: never return a half-decoded image.

    A warning that leaves the pixels whole (stray bytes before a marker, seen
    in real data sets; Pillow decodes those files) is let through: the file is
    decoded again without strictness, once it is known to end properly.
    """
    try:
        return decode(True)
    except ValueError as e:
        if not _jpeg_stream.is_harmless_warning(str(e)) or not _jpeg_stream.is_complete(data):
            raise _fail(src, f"corrupt or truncated JPEG ({e})") from e
    try:
        return decode(False)
    except ValueError as e:
        raise _fail(src, f"corrupt or truncated JPEG ({e})") from e


def _check_pixel_limit(src: Any, height: int, width: int) -> None:
    """Pillow's decompression-bomb limit (``PIL.Image.MAX_IMAGE_PIXELS``), for the JPEGs decoded without Pillow.

    Its warning above the limit, its error (here an ImageDecodeError, as from
    every other format) above twice the limit, before any memory is taken.
    """
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    pixels = height * width
    if limit is None or pixels <= limit:
        return
    if pixels > 2 * limit:
        raise _fail(src, f"Image size ({pixels} pixels) exceeds limit of {2 * limit} pixels, "
                         "could be decompression bomb DOS attack.")
    warnings.warn(f"Image size ({pixels} pixels) exceeds limit of {limit} pixels, "
                  "could be decompression bomb DOS attack.", Image.DecompressionBombWarning, stacklevel=4)


def _complete(data: Any, fmt: str | None) -> bool:
    """Whether a file Pillow will decode has its end marker (truncation check).

    Pillow can be told globally (``ImageFile.LOAD_TRUNCATED_IMAGES``) to return
    truncated images padded with grey; this check does not depend on it.
    """
    if fmt in ("JPEG", "MPO"):
        return _jpeg_stream.is_complete(data)
    raw = bytes(data) if not isinstance(data, bytes) else data
    if fmt == "PNG":
        return raw.rfind(b"IEND") > raw.rfind(b"IDAT")
    return True


class _EndWatch(io.BytesIO):
    """The encoded bytes as Pillow reads them, noting a read that found no data left.

    Pillow's decoding loop reads past the end only when the image needs
    more data than the file has; it raises then, unless the process-wide
    ``ImageFile.LOAD_TRUNCATED_IMAGES`` is set, when it returns the image
    padded. The note refuses such files whatever that flag says.
    """

    ran_out = False

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        if not chunk and size != 0:
            self.ran_out = True
        return chunk


@contextlib.contextmanager
def _watching_load_read(im: Any, fp: _EndWatch) -> Iterator[None]:
    """Note in ``fp`` when the plugin's own reader (``load_read``: PNG's IDAT chunks) runs dry.

    Such a plugin ends the image data itself, before the file's end: a scan
    cut short reads as an empty chunk there, never as a read past the end of
    ``fp``. Pillow's decoding loop takes either as truncation.
    """
    read = getattr(im, "load_read", None)
    if read is None:
        yield
        return

    def load_read(size: int) -> bytes:
        try:
            chunk = read(size)
        except (IndexError, struct.error):  # Pillow's other sign of truncation
            fp.ran_out = True
            raise
        if not chunk and size != 0:
            fp.ran_out = True
        return chunk

    im.load_read = load_read
    try:
        yield
    finally:
        # The wrapper holds the image (a reference cycle). Left in place, every
        # image would wait for the garbage collector.
        del im.load_read


def _decode_pillow(data: Any, src: Any, crop: Sequence[int] | None) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        # Open with the file's plugin alone: the other plugins' probes read
        # past the end of small files, which must not count as truncation.
        # The common formats are told by their signature; Pillow identifies
        # the rest (a first open, costly beside a small image's decode).
        fmt = _signature_format(data)
        if fmt is None:
            with Image.open(io.BytesIO(data)) as probe:
                fmt = probe.format
        fp = _EndWatch(data)
        with Image.open(fp, formats=[fmt] if fmt else None) as im, _watching_load_read(im, fp):
            if not _complete(data, im.format):
                raise _fail(src, f"truncated {im.format} data (no end marker)")
            if crop is not None:
                top, left, h, w = _check_crop(crop, im.height, im.width, src)
            im.load()
            # JPEG 2000's decoder reads the file itself, to its end, and
            # raises on a truncated one ("broken data stream").
            if fp.ran_out and im.format != "JPEG2000":
                raise _fail(src, f"truncated {im.format} data")
            if crop is not None:
                im = im.crop((left, top, left + w, top + h))
            # Same conversion as torchvision's pil_loader (alpha dropped,
            # palette expanded, CMYK/grey converted by Pillow).
            rgb = im if im.mode == "RGB" else im.convert("RGB")  # convert() would copy an RGB image
            return np.array(rgb)  # writable copy, so torch can wrap it
    except (ImageDecodeError, _CropOutsideImage):
        raise
    except UnidentifiedImageError as e:
        raise _fail(src, "not an image, or a format Pillow cannot read") from e
    except ValueError as e:
        raise _fail(src, str(e) or type(e).__name__) from e
    except (OSError, SyntaxError, EOFError, struct.error, Image.DecompressionBombError) as e:
        raise _fail(src, str(e) or type(e).__name__) from e


def _decode_data(
    data: Any, src: Any, size: tuple[int, int] | None, crop: Sequence[int] | None,
    reducing_gap: float | None, fastdct: bool, fastupsample: bool,
) -> Frame:
    if len(data) == 0:
        raise _fail(src, "empty file")
    arr = None
    if _is_jpeg(data):
        header = _jpeg_header(data, src)
        _check_pixel_limit(src, header[0], header[1])
        if header[2] not in ("CMYK", "YCCK"):  # Adobe CMYK needs Pillow's inversion handling
            arr = _decode_simplejpeg(data, src, header, size, crop, reducing_gap, fastdct, fastupsample)
        else:
            _check_jpeg_data(data, src)
    if arr is None:
        arr = _decode_pillow(data, src, crop)
    if size is not None and arr.shape[:2] != size:
        # The resize is left pending: frame_collate runs it straight into the
        # batch buffer; reading the frame runs it into a new array.
        return _deferred(arr, size)
    return Frame(arr)


def _check_jpeg_data(data: Any, src: Any) -> None:
    """Refuse a damaged JPEG that Pillow would decode (CMYK ones go through Pillow).

    Pillow's libjpeg only warns about a scan cut short (and pads it with
    grey); a strict decode, as of every RGB file, makes that an error.
    """
    _strict_unless_harmless(data, src, lambda strict: jpeg.decode_jpeg(data, colorspace="CMYK", strict=strict))


def _jpeg_header(data: Any, src: Any) -> tuple:
    try:
        return jpeg.decode_jpeg_header(data)
    except ValueError as e:
        raise _fail(src, f"corrupt JPEG header ({e})") from e


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
        OSError: the path cannot be read (a directory, no permission).
        TypeError: ``source`` is neither a path nor a bytes-like object.
        ImageDecodeError: empty, truncated, corrupt or non-image data (the
            message names the file, or ``<bytes of length N>``).
        ValueError: a bad ``size``, ``crop`` (not four integers, or outside
            the image) or ``reducing_gap`` (below 1.0).
    """
    # Arguments are checked before any I/O: a bad one is the caller's error,
    # the same for every file, never an ImageDecodeError.
    pair = _pair(size, "size") if size is not None else None
    if crop is not None:
        crop = _crop_box(crop)
    _check_reducing_gap(reducing_gap)
    if crop is None and _native_load is not None and (type(source) is str or type(source) is bytes):
        # Read, header, scaled decode in one native call (one GIL release);
        # what it does not decode comes back, read, for the path below.
        frame = _native_frame(source, pair, reducing_gap, fastdct, fastupsample)
        if type(frame) is Frame:
            return frame
        data = frame
    else:
        # ImageFolder's paths are the common case: first and cheapest.
        data = _read_file(source) if type(source) is str else _read_source(source)
    try:
        return _decode_data(data, source, pair, crop, reducing_gap, fastdct, fastupsample)
    except _CropOutsideImage as e:
        # The internal class would show in the user's traceback.
        raise ValueError(str(e)) from None


# --- the native path ------------------------------------------------------------

def _bind_native() -> Callable[..., Any] | None:
    """``_native.load`` bound to the TurboJPEG library, or None (not built, no library, or turned off).

    ``THREADLOADER_NATIVE=0`` turns it off: the Python path then decodes
    every file.
    """
    if os.environ.get("THREADLOADER_NATIVE", "1") == "0":
        return None
    try:
        from . import _native  # type: ignore[attr-defined]
    except ImportError:  # not built (the build is optional): the Python path decodes
        return None
    path = _turbojpeg.library_path()
    if path is None:
        return None
    try:
        _native.bind(path)
    except OSError:
        return None
    return _native.load


def _install_native() -> None:
    """Bind the native part (or not, see :func:`_bind_native`): the decoder here, the resize in frames."""
    global _native_load
    _native_load = _bind_native()
    _frames._native_resize = None
    if _native_load is not None:
        from . import _native  # type: ignore[attr-defined]

        _frames._native_resize = _native.resize_into


#: The native reader-decoder, or None: every file goes the Python way.
_native_load: Callable[..., Any] | None = None
_install_native()
#: Decoded pixels larger than this are never the guess for the next image's buffer (one panorama
#: must not make every pooled block that large).
_GUESS_CAP = 16 << 20
#: Images per window of the guess. The guess grows to the largest size seen at once, and shrinks
#: only when a whole window's images were all under half of it: one block size fits a data set of
#: scattered sizes (the pool reuses blocks of one size), and a rare large image is forgotten.
_GUESS_WINDOW = 64


class _SizeGuess:
    """The buffer size the next natively decoded image is guessed to need, one per process.

    The C call learns an image's size only once it has read the file, so its
    buffer is taken before. The guess is shared by every worker thread (a new
    epoch's threads start with it). It is a hint: any value is correct, since
    an image that does not fit gets memory of its own. So threads update it
    without a lock.
    """

    __slots__ = ("nbytes", "window", "seen")

    def __init__(self) -> None:
        self.nbytes, self.window, self.seen = 1, 0, 0

    def learn(self, nbytes: int) -> None:
        """Take a decoded image of ``nbytes`` into the guess."""
        if nbytes > _GUESS_CAP:
            return
        window, seen = max(self.window, nbytes), self.seen + 1
        if nbytes > self.nbytes:
            self.nbytes = nbytes
        if seen < _GUESS_WINDOW:
            self.window, self.seen = window, seen
            return
        if window < self.nbytes // 2:
            self.nbytes = window
        self.window, self.seen = 0, 0


_guess = _SizeGuess()


def _pixel_limit() -> int:
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    return -1 if limit is None else int(limit)


def scaled_dims(height: int, width: int, factor: int) -> tuple[int, int]:
    """Rows and columns libjpeg decodes from a ``height`` x ``width`` JPEG at scale 1/``factor`` (rounded up)."""
    return -(-height // factor), -(-width // factor)


def native_nbytes(height: int, width: int, factor: int) -> int:
    """Bytes of the pixels the native call decodes from a ``height`` x ``width`` JPEG at scale 1/``factor``."""
    rows, cols = scaled_dims(height, width, factor)
    return rows * cols * 3


def native_image(pixels: Any, height: int, width: int, factor: int) -> np.ndarray:
    """The ``(rows, cols, 3)`` uint8 view of the native call's ``pixels`` (a buffer at least that long).

    As :func:`_decode_simplejpeg`, the image's edges map to the nearest scaled
    pixel: a last, partial row or column of a scaled decode is left out.
    """
    rows, cols = scaled_dims(height, width, factor)
    arr = np.frombuffer(pixels, dtype=np.uint8, count=rows * cols * 3).reshape(rows, cols, 3)
    if factor > 1:
        _, _, bottom, right = _scaled_box((0, 0, height, width), 1.0 / factor, 1.0 / factor)
        arr = arr[:bottom, :right]
    return arr


def _native_frame(
    source: str | bytes, size: tuple[int, int] | None, reducing_gap: float | None, fastdct: bool, fastupsample: bool,
) -> Frame | Any:
    """The frame of a JPEG that the native call decoded, or the source's bytes for the Python path.

    The pixels go into a pooled block the size of this thread's last image
    (the size is known only once the file is read); a larger image gets
    memory of its own and sets the size for the next.

    Raises:
        OSError: the file cannot be read (as :func:`_read_file` raises it).
    """
    out = decode_pool.take_bytes(_guess.nbytes)
    status, data, pixels, height, width, factor = _native_load(
        source, size[0] if size else 0, size[1] if size else 0, reducing_gap or 0.0, _pixel_limit(),
        fastdct, fastupsample, out)
    if status:
        return source if data is None else data
    _guess.learn(native_nbytes(height, width, factor))
    arr = native_image(pixels, height, width, factor)
    if size is not None and arr.shape[:2] != size:
        return _deferred(arr, size)
    return Frame(arr)


def image_size(source: Source) -> tuple[int, int]:
    """``(height, width)`` of an encoded image, read from its header only.

    Raises:
        FileNotFoundError: missing path.
        OSError: the path cannot be read (a directory, no permission).
        TypeError: ``source`` is neither a path nor a bytes-like object.
        ImageDecodeError: not a readable image.
    """
    return _size_of(_read_source(source), source)


def _size_of(data: Any, src: Any) -> tuple[int, int]:
    if len(data) == 0:
        raise _fail(src, "empty file")
    if _is_jpeg(data):
        h, w = _jpeg_header(data, src)[:2]
        return h, w
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:  # lazy: reads the header only
            return im.height, im.width
    except UnidentifiedImageError as e:
        raise _fail(src, "not an image, or a format Pillow cannot read") from e
    except (OSError, SyntaxError, ValueError, EOFError, struct.error) as e:
        raise _fail(src, str(e) or type(e).__name__) from e

