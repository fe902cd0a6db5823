"""decode_image, RandomResizedCropLoader, load_npy/load_npz against PIL/torchvision/NumPy."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch
from helpers import require_torchvision
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from PIL import Image

from threadloader import Frame, frame_collate
from threadloader.images import _turbojpeg
from threadloader.images import decode as _image_module
from threadloader.images._codec import jpeg as codec
from threadloader.images._jpeg_stream import is_lossless as _is_lossless_jpeg
from threadloader.images.datagen import photo_like_image
from threadloader.images.decode import _dct_factor
from threadloader.io import (
    ImageDecodeError,
    RandomResizedCropLoader,
    decode_image,
    image_size,
    load_npy,
    load_npz,
    random_resized_crop_params,
)

T = require_torchvision("transforms")  # the reference for resize and crops; skips this module without it


def smooth_image(h: int, w: int, seed: int = 0) -> np.ndarray:
    """Photo-like pixels with real-photo smoothness (synthetic detail scaled up 4x)."""
    small = photo_like_image(max(2, h // 4), max(2, w // 4), seed)
    return np.array(Image.fromarray(small).resize((w, h), Image.BICUBIC))


def encode(pixels: np.ndarray, fmt: str, mode: str | None = None, **kw) -> bytes:
    im = Image.fromarray(pixels)
    if mode:
        im = im.convert(mode)
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def pil_rgb(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


def diff(a: torch.Tensor, b: torch.Tensor) -> tuple[int, float]:
    d = (a.int() - b.int()).abs()
    return int(d.max()), float(d.float().mean())


@pytest.fixture(scope="module")
def rgb() -> np.ndarray:
    return smooth_image(120, 160, seed=1)


@pytest.fixture(scope="module")
def jpeg(rgb) -> bytes:
    return codec.encode_jpeg(rgb, quality=90)


# --- exact decode ----------------------------------------------------------------

def test_jpeg_decode_matches_codec_and_pil(jpeg) -> None:
    f = decode_image(jpeg)
    assert isinstance(f, Frame) and f.shape == (120, 160, 3)
    assert np.array_equal(f.numpy(), codec.decode_jpeg(jpeg))
    m, mean = diff(f.to_tensor(), T.PILToTensor()(pil_rgb(jpeg)))
    assert m <= 2 and mean < 0.1


@pytest.mark.parametrize("fmt,mode", [
    ("PNG", "RGB"), ("PNG", "L"), ("PNG", "P"), ("PNG", "RGBA"), ("PNG", "LA"), ("PNG", "I;16"),
    ("BMP", "RGB"), ("GIF", "P"), ("TIFF", "CMYK"), ("WEBP", "RGB"),
])
def test_pillow_formats_bit_identical_to_pil_loader(rgb, fmt, mode, tmp_path) -> None:
    kw = {"lossless": True} if fmt == "WEBP" else {}
    data = encode(rgb, fmt, mode, **kw)
    f = decode_image(data)
    assert f.shape == (120, 160, 3)
    assert np.array_equal(f.numpy(), np.asarray(pil_rgb(data)))


@pytest.mark.parametrize("mode", ["L", "CMYK"])
def test_grey_and_cmyk_jpeg(rgb, mode) -> None:
    data = encode(rgb, "JPEG", mode, quality=92)
    f = decode_image(data)
    assert f.shape == (120, 160, 3)
    m, mean = diff(f.to_tensor(), T.PILToTensor()(pil_rgb(data)))
    assert m <= 2 and mean < 0.1
    if mode == "L":  # grey replicated into R, G, B
        assert np.array_equal(f.numpy()[..., 0], f.numpy()[..., 2])


def test_bytes_path_memoryview_identical(tmp_path, jpeg) -> None:
    p = tmp_path / "a.jpg"
    p.write_bytes(jpeg)
    a = decode_image(p, size=(50, 70)).numpy()
    for src in (str(p), jpeg, bytearray(jpeg), memoryview(jpeg), np.frombuffer(jpeg, np.uint8)):
        assert np.array_equal(decode_image(src, size=(50, 70)).numpy(), a)


# --- resize ----------------------------------------------------------------------

@pytest.mark.parametrize("size", [(224, 224), (64, 64), (100, 40), (37, 200), 96])
@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_resize_matches_torchvision_resize(rgb, fmt, size) -> None:
    data = codec.encode_jpeg(rgb, quality=90) if fmt == "JPEG" else encode(rgb, "PNG")
    f = decode_image(data, size=size, reducing_gap=None)
    hw = (size, size) if isinstance(size, int) else size
    ref = T.PILToTensor()(T.Resize(hw)(pil_rgb(data)))
    assert f.shape == (*hw, 3)
    m, mean = diff(f.to_tensor(), ref)
    assert m <= 3 and mean < 0.5


def test_dct_scaled_resize_close_to_full(tmp_path) -> None:
    big = smooth_image(600, 800, seed=2)
    data = codec.encode_jpeg(big, quality=90)
    ref = T.PILToTensor()(T.Resize((64, 96))(pil_rgb(data)))
    # reducing_gap=1 trades accuracy for speed (the last resize is nearly 1:1).
    for gap, (max_limit, mean_limit) in ((1.0, (24, 3.0)), (2.0, (16, 1.5))):
        m, mean = diff(decode_image(data, size=(64, 96), reducing_gap=gap).to_tensor(), ref)
        assert mean < mean_limit and m <= max_limit, (gap, m, mean)
    exact = decode_image(data, size=(64, 96), reducing_gap=None).to_tensor()
    assert diff(exact, ref)[0] <= 3


# --- crops -----------------------------------------------------------------------

@pytest.mark.parametrize("crop,size", [((10, 20, 60, 90), None), ((0, 0, 120, 160), (30, 40)),
                                       ((33, 7, 51, 77), (20, 20)), ((5, 150, 100, 10), (50, 5))])
@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_crop_equals_full_decode_then_crop(rgb, crop, size, fmt) -> None:
    data = codec.encode_jpeg(rgb, quality=90) if fmt == "JPEG" else encode(rgb, "PNG")
    top, left, h, w = crop
    full = decode_image(data).numpy()
    got = decode_image(data, crop=crop, size=size, reducing_gap=None).numpy()
    if size is None:
        assert np.array_equal(got, full[top:top + h, left:left + w])
    else:
        ref = T.PILToTensor()(T.Resize(size)(Image.fromarray(full[top:top + h, left:left + w])))
        m, mean = diff(torch.from_numpy(got).permute(2, 0, 1), ref)
        assert m <= 3 and mean < 0.5


def test_crop_with_dct_scaling_close_to_full_decode_crop() -> None:
    data = codec.encode_jpeg(smooth_image(600, 800, seed=3), quality=90)
    full = Image.fromarray(decode_image(data).numpy())
    for crop, size in [((40, 80, 400, 480), (48, 48)), ((0, 0, 600, 800), (70, 90)), ((17, 33, 301, 377), (40, 50))]:
        top, left, h, w = crop
        ref = T.PILToTensor()(T.Resize(size)(full.crop((left, top, left + w, top + h))))
        m, mean = diff(decode_image(data, crop=crop, size=size, reducing_gap=2.0).to_tensor(), ref)
        # Odd crop edges fall mid-way between 1/2-scale pixels (rounded): a
        # shift of <= 1/4 output pixel on top of the DCT filter difference.
        assert mean < 2.0 and m <= 16, (crop, m, mean)


@pytest.mark.parametrize("shape", [(1001, 1003), (803, 1203), (999, 997)])
def test_crop_with_dct_scaling_on_sizes_not_multiple_of_8(shape) -> None:
    # A scaled pixel is one f x f source block whatever the image size: a crop
    # edge at y maps to y / f (the region decoder once mapped it with
    # ceil(H / f) / H, a shift of one scaled row on such sizes).
    data = codec.encode_jpeg(smooth_image(*shape, seed=5), quality=95)
    full = Image.fromarray(decode_image(data).numpy())
    # Crop edges on multiples of 8 (as RandomResizedCropLoader snaps them):
    # exact at 1/8 scale, so what remains is the DCT filter's difference.
    for crop, size in [((400, 496, 400, 496), (25, 31)), ((96, 200, 704, 640), (44, 40)),
                       ((8, 0, 640, 704), (40, 44))]:
        top, left, ch, cw = crop
        ref = T.PILToTensor()(T.Resize(size)(full.crop((left, top, left + cw, top + ch))))
        m, mean = diff(decode_image(data, crop=crop, size=size).to_tensor(), ref)
        assert mean < 2.0 and m <= 16, (shape, crop, m, mean)


def test_crop_outside_image_raises(jpeg) -> None:
    for crop in [(0, 0, 121, 10), (-1, 0, 5, 5), (0, 150, 10, 11), (0, 0, 0, 5)]:
        with pytest.raises(ValueError, match="does not fit") as info:
            decode_image(jpeg, crop=crop)
        assert type(info.value) is ValueError  # not an internal subclass
    with pytest.raises(ValueError, match="does not fit") as info:
        decode_image(encode(np.zeros((8, 8, 3), np.uint8), "PNG"), crop=(0, 0, 9, 9))
    assert type(info.value) is ValueError


def test_random_resized_crop_params_match_torchvision() -> None:
    img = torch.zeros(3, 375, 500)
    for seed in range(20):
        torch.manual_seed(seed)
        ref = T.RandomResizedCrop.get_params(img, [0.08, 1.0], [3 / 4, 4 / 3])
        torch.manual_seed(seed)
        assert random_resized_crop_params(375, 500) == ref
    # Fallback path (impossible aspect ratio) matches too.
    torch.manual_seed(0)
    ref = T.RandomResizedCrop.get_params(torch.zeros(3, 10, 500), [0.9, 1.0], [1.0, 1.0])
    torch.manual_seed(0)
    assert random_resized_crop_params(10, 500, (0.9, 1.0), (1.0, 1.0)) == ref


@pytest.mark.parametrize("gap", [None, 1.0, 2.0])
def test_random_resized_crop_loader_equals_full_decode_crop_resize(gap) -> None:
    data = codec.encode_jpeg(smooth_image(600, 800, seed=4), quality=90)
    full = Image.fromarray(decode_image(data).numpy())
    loader = RandomResizedCropLoader(64, generator=torch.Generator().manual_seed(0), reducing_gap=gap)
    for _ in range(8):
        f, (top, left, h, w) = loader.sample(data)
        assert f.shape == (64, 64, 3)
        ref = T.PILToTensor()(T.Resize((64, 64))(full.crop((left, top, left + w, top + h))))
        m, mean = diff(f.to_tensor(), ref)
        limit = {None: (3, 0.5), 1.0: (24, 3.0), 2.0: (16, 1.5)}[gap]
        assert m <= limit[0] and mean < limit[1], (gap, (top, left, h, w), m, mean)


class _DrawnBox(RandomResizedCropLoader):
    """A loader whose "random" draw is a given box."""

    box: tuple[int, int, int, int] = (0, 0, 1, 1)

    def get_params(self, height: int, width: int) -> tuple[int, int, int, int]:
        return self.box


@pytest.fixture(scope="module")
def jpeg_600() -> bytes:
    return codec.encode_jpeg(smooth_image(600, 600, seed=6), quality=90)


def _check_snapped(loader: _DrawnBox, data: bytes, box: tuple[int, int, int, int], side: int) -> None:
    loader.box = box
    frame, (t, l, h, w) = loader.sample(data)
    assert frame.shape == (*loader.size, 3)
    factor = _dct_factor(h, w, loader.size, loader.reducing_gap)
    edges, drawn = (t, l, t + h, l + w), (box[0], box[1], box[0] + box[2], box[1] + box[3])
    assert all(e % factor == 0 or e == side for e in edges), (box, edges, factor)
    assert all(abs(a - b) < 2 * factor for a, b in zip(edges, drawn)), (box, edges, factor)


def test_random_resized_crop_box_falls_on_the_pixels_of_the_scale_decoded(jpeg_600) -> None:
    # Snapped to the drawn box's scale (1/2), (2, 2, 511, 511) grew to 512
    # and was decoded at 1/4, off its pixels (half a scaled pixel's shift).
    _check_snapped(_DrawnBox(64, reducing_gap=2.0), jpeg_600, (2, 2, 511, 511), 600)


@settings(max_examples=80, deadline=None)
@given(top=st.integers(0, 300), left=st.integers(0, 300), h=st.integers(40, 300), w=st.integers(40, 300),
       size=st.sampled_from([16, 32, 64]), gap=st.sampled_from([1.0, 2.0]))
def test_random_resized_crop_boxes_fall_on_the_pixels_of_their_scale(jpeg_600, top, left, h, w, size, gap):
    _check_snapped(_DrawnBox(size, reducing_gap=gap), jpeg_600, (top, left, h, w), 600)


def test_random_resized_crop_loader_generator_and_png(rgb) -> None:
    png = encode(rgb, "PNG")
    a = RandomResizedCropLoader((32, 48), generator=torch.Generator().manual_seed(5))
    b = RandomResizedCropLoader((32, 48), generator=torch.Generator().manual_seed(5))
    fa, ca = a.sample(png)
    fb, cb = b.sample(png)
    assert ca == cb and np.array_equal(fa.numpy(), fb.numpy()) and fa.shape == (32, 48, 3)
    # Without a generator outside worker threads: torchvision's global-RNG draws.
    torch.manual_seed(3)
    _, crop = RandomResizedCropLoader(16).sample(png)
    torch.manual_seed(3)
    assert crop == T.RandomResizedCrop.get_params(torch.zeros(3, 120, 160), [0.08, 1.0], [3 / 4, 4 / 3])


def test_image_size(jpeg, rgb) -> None:
    assert image_size(jpeg) == (120, 160)
    assert image_size(encode(rgb, "PNG")) == (120, 160)


# --- bad input -------------------------------------------------------------------

def test_missing_file_names_path(tmp_path) -> None:
    p = tmp_path / "nope.jpg"
    with pytest.raises(FileNotFoundError, match="nope.jpg"):
        decode_image(p)
    with pytest.raises(FileNotFoundError, match="nope.jpg"):
        decode_image(str(p))
    with pytest.raises(FileNotFoundError, match="nope.jpg"):
        RandomResizedCropLoader(8)(str(p))


def test_directory_and_unreadable_file_errors_name_the_path(tmp_path) -> None:
    """As ``open(path, "rb")`` would: the same exception types, naming the path."""
    d = tmp_path / "a_dir.jpg"
    d.mkdir()
    for src in (d, str(d)):
        with pytest.raises(IsADirectoryError, match="a_dir.jpg"):
            decode_image(src)
    if os.geteuid() != 0:  # root reads whatever the mode says
        locked = tmp_path / "locked.jpg"
        locked.write_bytes(b"\xff\xd8\xff")
        locked.chmod(0)
        with pytest.raises(PermissionError, match="locked.jpg"):
            decode_image(str(locked))


@settings(max_examples=25, deadline=None)
@given(size=st.sampled_from([0, 1, 2, 4095, 4096, 65535, 65536, 65537, 300_001]), seed=st.integers(0, 2**16))
def test_file_reads_return_the_whole_file(tmp_path_factory, size: int, seed: int) -> None:
    from threadloader.images.decode import _read_file

    p = tmp_path_factory.mktemp("read") / "f.bin"
    data = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()
    p.write_bytes(data)
    assert _read_file(str(p)) == data and _read_file(p) == data


def test_file_reads_get_what_was_appended_after_the_size_was_read(tmp_path, monkeypatch) -> None:
    """A file that grows between fstat and read is read to its end, not cut at the old size."""
    from threadloader.images import decode as image

    p = tmp_path / "growing.bin"
    data = bytes(range(256)) * 1000
    p.write_bytes(data)
    real_fstat = os.fstat

    class Stale:
        def __init__(self, st):
            self.st_mode, self.st_size = st.st_mode, 1000  # the size before the file grew

    monkeypatch.setattr(image, "_fstat", lambda fd: Stale(real_fstat(fd)))
    assert image._read_file(str(p)) == data


def test_file_reads_do_not_trust_a_size_of_zero() -> None:
    """Special files report size 0 but have content (a file that grew since its stat is the same case)."""
    from threadloader.images.decode import _read_file

    if not os.path.exists("/proc/self/cmdline"):
        pytest.skip("needs Linux /proc")
    assert os.stat("/proc/self/cmdline").st_size == 0
    with open("/proc/self/cmdline", "rb") as f:
        assert _read_file("/proc/self/cmdline") == f.read() != b""


def _bad_inputs(jpeg: bytes, png: bytes) -> dict[str, tuple[bytes, str]]:
    corrupt = bytearray(jpeg)
    corrupt[len(jpeg) // 2:len(jpeg) // 2 + 64] = b"\xff" * 64  # Pillow refuses it too
    return {
        "empty": (b"", "empty"),
        "text": (b"hello, I am not an image", "not an image"),
        "jpeg_truncated_half": (jpeg[: len(jpeg) // 2], "truncated"),
        "jpeg_truncated_eoi": (jpeg[:-2], "truncated"),
        "jpeg_header_only": (jpeg[:20], "JPEG"),
        "jpeg_corrupt": (bytes(corrupt), "JPEG"),
        "png_truncated": (png[: len(png) // 2], "truncated"),
        "png_no_iend": (png[:-12], "truncated"),
        "png_header_only": (png[:30], ""),
    }


@pytest.mark.parametrize("case", list(_bad_inputs(b"x" * 100, b"y" * 100)))
def test_bad_input_errors_name_source_and_reason(case, jpeg, rgb, tmp_path) -> None:
    data, reason = _bad_inputs(jpeg, encode(rgb, "PNG"))[case]
    p = tmp_path / f"{case}.img"
    p.write_bytes(data)
    sources = [(p, repr(str(p))), (str(p), repr(str(p))), (data, f"<bytes of length {len(data)}>"),
               (bytearray(data), f"<bytes of length {len(data)}>"),
               (memoryview(data), f"<bytes of length {len(data)}>")]
    for src, name in sources:
        # The crop loader is asked for the whole image: a crop decode reads the
        # file only down to the crop's last row (see test_crop_decode_reads_only_what_it_needs).
        whole = RandomResizedCropLoader(8, scale=(1.0, 1.0), ratio=(160 / 120, 160 / 120))
        for call in (decode_image, functools.partial(decode_image, size=(8, 8)), whole):
            with pytest.raises(ImageDecodeError) as info:
                call(src)
            msg = str(info.value)
            assert name in msg and reason in msg, msg
            assert isinstance(info.value, ValueError)


def _decodes_like_pil(data: bytes) -> None:
    """Whole, resized, cropped (bottom rows included) and random-crop decodes agree with Pillow's pixels."""
    ref = np.array(pil_rgb(data))
    h, w = ref.shape[:2]
    assert np.array_equal(decode_image(data).numpy(), ref)
    assert decode_image(data, size=(8, 8)).shape == (8, 8, 3)
    assert np.array_equal(decode_image(data, crop=(h - 10, 0, 10, w)).numpy(), ref[h - 10:])
    whole = RandomResizedCropLoader(8, scale=(1.0, 1.0), ratio=(w / h, w / h))
    assert whole(data).shape == (8, 8, 3)


@pytest.mark.parametrize("mode", ["RGB", "CMYK"])
def test_bytes_after_the_end_of_image_are_not_read(rgb, mode) -> None:
    # A Motion Photo carries a video after the JPEG's end: its bytes may look
    # like a start-of-scan marker, which made the file "truncated".
    data = encode(rgb, "JPEG", mode) + b"\x00\xff\xda\x00\x0c" + bytes(range(256)) * 4
    _decodes_like_pil(data)


@pytest.mark.parametrize("mode", ["RGB", "CMYK"])
def test_stray_bytes_before_the_end_marker_decode_as_in_pillow(rgb, mode) -> None:
    # libjpeg warns "N extraneous bytes before marker 0xd9" and decodes the
    # whole image (seen in real data sets); a strict decode refused it, and a
    # crop only when it reached the bottom rows.
    clean = encode(rgb, "JPEG", mode)
    data = clean[:-2] + b"\x00" * 16 + b"\xff\xd9"
    assert np.array_equal(np.array(pil_rgb(data)), np.array(pil_rgb(clean)))
    _decodes_like_pil(data)
    with pytest.raises(ImageDecodeError, match="truncated"):  # still refused when the end is cut off
        decode_image(data[: len(data) // 2] + b"\x00" * 16)


def test_jpeg2000_decodes_and_a_truncated_one_is_refused(rgb) -> None:
    # Its decoder reads the file itself, to the end: that was taken for truncation.
    data = encode(rgb, "JPEG2000")
    assert np.array_equal(decode_image(data).numpy(), np.array(pil_rgb(data)))
    with pytest.raises(ImageDecodeError):
        decode_image(data[: len(data) - 10])


def test_pillows_decompression_bomb_limit_applies_to_jpegs(rgb, monkeypatch) -> None:
    # Decoded without Pillow, a JPEG whose header claims 20000 x 20000 pixels
    # took 1.2 GB before failing; Pillow refuses it from the header.
    from PIL import Image as PILImage

    data = encode(rgb, "JPEG")  # 120 x 160
    for mode in ("RGB", "CMYK"):
        monkeypatch.setattr(PILImage, "MAX_IMAGE_PIXELS", 120 * 160 // 2 - 1)
        with pytest.raises(ImageDecodeError, match="could be decompression bomb"):
            decode_image(encode(rgb, "JPEG", mode))
        with pytest.raises(PILImage.DecompressionBombError):
            pil_rgb(encode(rgb, "JPEG", mode))
    monkeypatch.setattr(PILImage, "MAX_IMAGE_PIXELS", 120 * 160 - 1)
    with pytest.warns(PILImage.DecompressionBombWarning):
        assert decode_image(data).shape == (120, 160, 3)


def test_truncated_png_detected_even_with_load_truncated_images(rgb, monkeypatch) -> None:
    from PIL import ImageFile

    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    png = encode(rgb, "PNG")
    with pytest.raises(ImageDecodeError, match="truncated"):
        decode_image(png[: len(png) // 2])
    cmyk = encode(rgb, "JPEG", "CMYK")
    with pytest.raises(ImageDecodeError, match="truncated"):
        decode_image(cmyk[: len(cmyk) // 2])


def _png_chunks(png: bytes):
    pos = 8
    while pos < len(png):
        n = int.from_bytes(png[pos:pos + 4], "big")
        yield png[pos + 4:pos + 8], png[pos + 8:pos + 8 + n]
        pos += 12 + n


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    import zlib

    return len(payload).to_bytes(4, "big") + kind + payload + zlib.crc32(kind + payload).to_bytes(4, "big")


@pytest.mark.parametrize("flag", [False, True])
@pytest.mark.parametrize("fmt", ["PNG", "JPEG RGB", "JPEG CMYK"])
def test_data_cut_short_before_a_valid_end_marker_is_refused(fmt, flag, monkeypatch) -> None:
    # The image data stops halfway, yet the file ends well: PNG's IDAT cut
    # (chunk CRCs valid, IEND present), a JPEG scan cut with EOI appended.
    # Pillow pads those with grey (a PNG with LOAD_TRUNCATED_IMAGES set, a
    # CMYK JPEG always); they were returned half-decoded.
    from PIL import ImageFile

    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", flag)
    pixels = np.random.default_rng(0).integers(0, 256, (200, 300, 3), dtype=np.uint8)
    if fmt == "PNG":
        png = encode(pixels, "PNG")
        chunks = list(_png_chunks(png))
        idat = b"".join(payload for kind, payload in chunks if kind == b"IDAT")
        damaged = (png[:8] + b"".join(_png_chunk(k, p) for k, p in chunks if k not in (b"IDAT", b"IEND"))
                   + _png_chunk(b"IDAT", idat[: len(idat) // 2]) + _png_chunk(b"IEND", b""))
    else:
        jpg = encode(pixels, "JPEG", fmt.split()[1], quality=90)
        sos = jpg.rfind(b"\xff\xda")
        damaged = jpg[: sos + (len(jpg) - sos) // 2] + b"\xff\xd9"
    with pytest.raises(ImageDecodeError, match="truncated"):
        decode_image(damaged)


_PILLOW_FORMATS = [("BMP", "RGB", {}), ("BMP", "P", {}), ("GIF", "P", {}), ("TIFF", "RGB", {}),
                   ("TIFF", "RGB", {"compression": "tiff_lzw"}), ("PPM", "RGB", {}), ("TGA", "RGB", {}),
                   ("TGA", "RGB", {"compression": "tga_rle"}), ("WEBP", "RGB", {"lossless": True}),
                   ("WEBP", "RGB", {}), ("ICO", "RGBA", {}), ("PNG", "RGBA", {}), ("PCX", "RGB", {})]


@pytest.mark.parametrize("flag", [False, True])
@pytest.mark.parametrize("fmt,mode,kw", _PILLOW_FORMATS, ids=lambda v: str(v))
def test_truncated_files_refused_in_every_format_whatever_load_truncated_images(
        fmt, mode, kw, flag, monkeypatch) -> None:
    from PIL import ImageFile

    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", flag)
    data = encode(np.random.default_rng(0).integers(0, 256, (37, 53, 3), dtype=np.uint8), fmt, mode, **kw)
    ref = np.array(pil_rgb(data))
    # The whole file decodes (other formats' probes reading past its end are not truncation).
    assert np.array_equal(decode_image(data).numpy(), ref)
    for cut in sorted({len(data) // 2, len(data) * 3 // 4, len(data) - 1, *range(1, len(data), 97)}):
        try:
            got = decode_image(data[:cut]).numpy()
        except ImageDecodeError:
            continue
        # Never half-decoded: what comes back is the whole image.
        assert np.array_equal(got, ref), (fmt, cut, len(data))


def test_bad_arguments(jpeg) -> None:
    with pytest.raises(TypeError):
        decode_image(12345)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        decode_image(jpeg, size=(0, 5))


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "BMP"])
def test_bad_arguments_are_value_errors_for_every_format(rgb, fmt) -> None:
    data = encode(rgb, fmt)
    bad = [dict(size=True), dict(size=(10.5, 10)), dict(size="ab"), dict(size=(1, 2, 3)),
           dict(crop=(1, 2, 3)), dict(crop=(1.7, 2, 5, 5)), dict(crop=5), dict(crop=(0, 0, True, 5)),
           dict(reducing_gap=0.5), dict(reducing_gap=-1.0), dict(reducing_gap=float("nan")),
           dict(reducing_gap="2")]
    for kwargs in bad:
        with pytest.raises(ValueError) as info:
            decode_image(data, **kwargs)
        # The caller's mistake, not a bad image: code skipping bad files with
        # ``except ImageDecodeError`` must not skip every file for it.
        assert not isinstance(info.value, ImageDecodeError), (kwargs, info.value)
    with pytest.raises(ValueError, match="reducing_gap must be 1.0 or greater"):
        RandomResizedCropLoader(32, reducing_gap=0.5)
    for kwargs in [dict(scale=(0.5,)), dict(scale=(0.9, 0.1)), dict(ratio=None), dict(ratio=("a", 1)),
                   dict(scale=(float("nan"), 1.0)), dict(ratio=(1, 2, 3))]:
        name = next(iter(kwargs))
        with pytest.raises(ValueError, match=f"^{name} must be two numbers \\(min, max\\), got "):
            RandomResizedCropLoader(32, **kwargs)
    assert RandomResizedCropLoader(32, scale=[0.5, 1], ratio=np.array([1, 2])).ratio == (1.0, 2.0)
    # NumPy integers are integers.
    assert decode_image(data, size=np.int64(8), crop=np.array([1, 2, 50, 60])).shape == (8, 8, 3)
    assert decode_image(data, size=(np.int32(8), 9)).shape == (8, 9, 3)


def test_strided_and_reversed_buffers_decode_their_logical_bytes(jpeg) -> None:
    ref = decode_image(jpeg).numpy()
    store = np.zeros(2 * len(jpeg), np.uint8)
    store[::2] = np.frombuffer(jpeg, np.uint8)
    assert np.array_equal(decode_image(store[::2]).numpy(), ref)
    assert np.array_equal(decode_image(memoryview(store)[::2]).numpy(), ref)
    # A reversed view whose logical bytes are no image, with a JPEG in the
    # memory right after its first element: the decoder must not read it.
    n = len(jpeg)
    store = np.zeros(4 * n, np.uint8)
    store[2 * n:3 * n] = np.frombuffer(jpeg, np.uint8)
    store[2 * n - 1], store[2 * n - 2] = 0xD8, 0xFF
    view = store[n + 1:2 * n + 1][::-1]
    assert view.tobytes()[:3] == b"\xff\xd8\xff" and not any(view.tobytes()[3:])
    with pytest.raises(ImageDecodeError):
        decode_image(view)
    with pytest.raises(ImageDecodeError):
        image_size(view[::2])


# --- ImageFolder through loaders ----------------------------------------------------

@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from threadloader.images.datagen import make_imagenet_like

    return make_imagenet_like(tmp_path_factory.mktemp("inet"), num_classes=3, images_per_class=5,
                              size=(60, 80))


def test_imagefolder_with_decode_image_matches_pil_pipeline(folder) -> None:
    from torchvision.datasets import ImageFolder

    ours = ImageFolder(folder, loader=functools.partial(decode_image, size=(32, 32)))
    ref = ImageFolder(folder, transform=T.Compose([T.Resize((32, 32)), T.PILToTensor()]))
    for i in range(len(ours)):
        (f, y), (t, y2) = ours[i], ref[i]
        assert y == y2
        m, mean = diff(f.to_tensor(), t)
        assert m <= 3 and mean < 0.5


def test_imagefolder_thread_loader_matches_dataloader(folder) -> None:
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    from threadloader import loader as loader_mod

    ds = ImageFolder(folder, loader=functools.partial(decode_image, size=(32, 32)))
    ours = loader_mod.ThreadDataLoader(ds, batch_size=4, shuffle=True, num_workers=2,
                                       collate_fn=frame_collate, generator=torch.Generator().manual_seed(7))
    ref = DataLoader(ds, batch_size=4, shuffle=True, num_workers=0, collate_fn=frame_collate,
                     generator=torch.Generator().manual_seed(7))
    got, want = list(ours), list(ref)
    assert len(got) == len(want) == 4
    for (x, y), (x2, y2) in zip(got, want):
        assert torch.equal(y, y2) and torch.equal(x, x2)
        assert x.shape[1:] == (3, 32, 32) and x.is_contiguous(memory_format=torch.channels_last)


def test_frame_collate_in_dataloader_worker_process(folder) -> None:
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    ds = ImageFolder(folder, loader=functools.partial(decode_image, size=(16, 16)))
    got = list(DataLoader(ds, batch_size=8, num_workers=1, collate_fn=frame_collate))
    want = list(DataLoader(ds, batch_size=8, num_workers=0, collate_fn=frame_collate))
    for (x, y), (x2, y2) in zip(got, want):
        assert torch.equal(x, x2) and torch.equal(y, y2)


# --- NumPy files -------------------------------------------------------------------

_dtypes = st.one_of(
    hnp.integer_dtypes(endianness="="), hnp.unsigned_integer_dtypes(endianness=">"),
    hnp.floating_dtypes(endianness="<"), hnp.complex_number_dtypes(), hnp.boolean_dtypes(),
    st.just(np.dtype([("a", "<i4"), ("b", ">f8")])), hnp.byte_string_dtypes(min_len=1, max_len=4),
)
_arrays = _dtypes.flatmap(lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)))


def _npy(arr: np.ndarray, version: tuple[int, int] | None = None) -> bytes:
    buf = io.BytesIO()
    if version is None:
        np.save(buf, arr)
    else:
        np.lib.format.write_array(buf, arr, version=version)
    return buf.getvalue()


def _same(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    # Byte comparison: exact, and NaN-safe for floats inside structured dtypes.
    assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


@settings(max_examples=60, deadline=None)
@given(arr=_arrays, fortran=st.booleans(), version=st.sampled_from([None, (1, 0), (2, 0), (3, 0)]))
def test_load_npy_matches_numpy(arr, fortran, version) -> None:
    if fortran:
        arr = np.asfortranarray(arr)
    data = _npy(arr, version)
    got = load_npy(data)
    _same(got, np.load(io.BytesIO(data)))
    if got.nbytes:
        assert np.shares_memory(got, np.frombuffer(data, np.uint8))
        assert not got.flags.writeable
    w = load_npy(bytearray(data))
    _same(w, arr)
    assert w.flags.writeable or w.size == 0


@pytest.mark.parametrize("shape", [(), (3,), (2, 0, 4), (4, 5)])
def test_load_npy_of_empty_items_matches_numpy(shape) -> None:
    # np.frombuffer refuses a zero itemsize: the loader must match np.load, not raise.
    data = _npy(np.zeros(shape, dtype="V0"))
    _same(load_npy(data), np.load(io.BytesIO(data)))


@settings(max_examples=30, deadline=None)
@given(arrs=st.dictionaries(st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True), _arrays, max_size=4),
       compressed=st.booleans())
def test_load_npz_matches_numpy(arrs, compressed) -> None:
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **arrs)
    data = buf.getvalue()
    got = load_npz(data)
    with np.load(io.BytesIO(data)) as ref:
        assert set(got) == set(ref.files) == set(arrs)
        for k in arrs:
            _same(got[k], ref[k])
            if not compressed and got[k].size:
                assert np.shares_memory(got[k], np.frombuffer(data, np.uint8))


def test_load_npz_mixed_members_and_non_npy() -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(zipfile.ZipInfo("a.npy"), _npy(np.arange(6).reshape(2, 3)), zipfile.ZIP_STORED)
        z.writestr("b.npy", _npy(np.ones((4, 4), ">f4")), zipfile.ZIP_DEFLATED)
        z.writestr("notes.txt", b"hi")
    got = load_npz(buf.getvalue())
    _same(got["a"], np.arange(6).reshape(2, 3))
    _same(got["b"], np.ones((4, 4), ">f4"))
    assert got["notes.txt"] == b"hi"


def test_load_npy_errors() -> None:
    good = _npy(np.arange(10, dtype=np.int64))
    cases = {
        b"": "not an NPY file",
        b"PK\x03\x04" + good[4:]: "not an NPY file",
        good[:8]: "truncated NPY header",
        good[:20]: "truncated NPY header",
        good[:-1]: "truncated NPY data",
        good[:6] + b"\x04\x00" + good[8:]: "unsupported NPY format version",
        good[:6] + b"\x01\x05" + good[8:]: "unsupported NPY format version 1.5",
        good.replace(b"'descr'", b"'descX'"): "malformed NPY header",
        good.replace(b"<i8", b"<zz"): "bad descr",
        good.replace(b"(10,)", b"(-1,)"): "bad shape",
        good.replace(b"False", b"0    "): "bad fortran_order",
        good.replace(b"{'descr'", b"[('descr'"): "malformed NPY header",
    }
    for data, msg in cases.items():
        with pytest.raises(ValueError, match=msg):
            load_npy(data)
    with pytest.raises(ValueError, match="pickle"):
        load_npy(_npy(np.array([1, "a", None], dtype=object)))
    with pytest.raises(TypeError):
        load_npy(12)  # type: ignore[arg-type]


def test_load_npz_tells_arrays_by_magic_not_name() -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("notes.npy", b"hello, not an array")
        z.writestr("data.bin", _npy(np.arange(5)))
        z.writestr("x.npy", _npy(np.zeros(2)))
        z.writestr("x", _npy(np.ones(3)))  # an exact name wins over "x.npy", as in numpy
    data = buf.getvalue()
    got = load_npz(data)
    with np.load(io.BytesIO(data)) as ref:
        assert list(got) == [k for k in dict.fromkeys(ref.files)]
        for k in got:
            if isinstance(ref[k], np.ndarray):
                _same(got[k], ref[k])
            else:
                assert got[k] == ref[k]


def test_load_npz_checks_the_crc_of_stored_members() -> None:
    buf = io.BytesIO()
    np.savez(buf, a=np.arange(10, dtype=np.int16))
    bad = bytearray(buf.getvalue())
    at = bytes(bad).rfind(np.arange(10, dtype=np.int16).tobytes())
    bad[at + 5] ^= 0xFF
    with pytest.raises(zipfile.BadZipFile):
        np.load(io.BytesIO(bytes(bad)))["a"]
    with pytest.raises(ValueError, match="'a.npy'.*CRC"):
        load_npz(bytes(bad))


def test_load_npz_errors() -> None:
    buf = io.BytesIO()
    np.savez(buf, a=np.arange(1000))
    data = buf.getvalue()
    with pytest.raises(ValueError, match="not a zip"):
        load_npz(b"hello")
    with pytest.raises(ValueError, match="not a zip|truncated"):
        load_npz(data[:-30])
    buf = io.BytesIO()
    np.savez_compressed(buf, a=np.arange(1000))
    bad = bytearray(buf.getvalue())
    bad[60:80] = b"\xff" * 20  # inside the deflate stream
    with pytest.raises(ValueError, match="'a.npy'"):
        load_npz(bytes(bad))


@pytest.mark.skipif(not _turbojpeg.available(), reason="needs a TurboJPEG 3 library for region decoding")
def test_crop_decode_reads_only_what_it_needs(rgb, jpeg) -> None:
    # Region decoding: the same pixels as decode + slice...
    full = decode_image(jpeg).numpy().astype(int)
    for box in [(0, 0, 40, 50), (17, 33, 60, 70), (64, 96, 56, 64), (0, 0, 120, 160)]:
        t, l, h, w = box
        got = decode_image(jpeg, crop=box).numpy().astype(int)
        assert got.shape == (h, w, 3)
        assert np.array_equal(got, full[t:t + h, l:l + w])
    # ...and rows below the crop are never read: corrupting them does not
    # affect a crop at the top, while a whole-image decode refuses the file.
    bad = bytearray(jpeg)
    tail = len(jpeg) - 400
    bad[tail:tail + 64] = b"\xff" * 64  # a run of marker prefixes: the full decode must fail
    top = decode_image(bytes(bad), crop=(0, 0, 16, 160)).numpy().astype(int)
    assert np.abs(top - full[:16]).mean() < 0.5
    with pytest.raises(ImageDecodeError):
        decode_image(bytes(bad))
    # Truncation is still refused, wherever the crop is.
    with pytest.raises(ImageDecodeError, match="truncated"):
        decode_image(jpeg[:-2], crop=(0, 0, 16, 16))


@pytest.mark.skipif(not _turbojpeg.available(), reason="needs a TurboJPEG 3 library for region decoding")
@settings(max_examples=60, deadline=None)
@given(subsampling=st.sampled_from([0, 1, 2]), factor=st.sampled_from([1, 2, 4, 8]), data=st.data())
def test_region_decode_equals_the_whole_scaled_image_sliced(subsampling, factor, data) -> None:
    # Chroma-subsampled (4:2:2, 4:2:0) crops must match in their side columns:
    # smooth upsampling must not take the region's sides for the image's.
    pixels = photo_like_image(72, 100, seed=subsampling)
    jpg = encode(pixels, "JPEG", quality=90, subsampling=subsampling)
    sh, sw = -(-72 // factor), -(-100 // factor)
    whole = codec.decode_jpeg(jpg, colorspace="RGB", min_height=sh if factor > 1 else 0,
                              min_width=sw if factor > 1 else 0)
    assert whole.shape[:2] == (sh, sw)
    top = data.draw(st.integers(0, sh - 1))
    left = data.draw(st.integers(0, sw - 1))
    bottom = data.draw(st.integers(top + 1, sh))
    right = data.draw(st.integers(left + 1, sw))
    got = _turbojpeg.decode_region(jpg, factor, (top, left, bottom, right))
    assert np.array_equal(got, whole[top:bottom, left:right])


def _lossless_jpeg(pixels: np.ndarray) -> bytes:
    """A lossless (SOF3) JPEG of ``pixels``, encoded by the TurboJPEG 3 library (Pillow cannot)."""
    import ctypes

    lib = ctypes.CDLL(_turbojpeg.library_path())
    vp, c_int = ctypes.c_void_p, ctypes.c_int
    lib.tj3Init.restype, lib.tj3Init.argtypes = vp, [c_int]
    lib.tj3Set.argtypes = [vp, c_int, c_int]
    lib.tj3Compress8.argtypes = [vp, vp, c_int, c_int, c_int, c_int, ctypes.POINTER(vp),
                                 ctypes.POINTER(ctypes.c_size_t)]
    lib.tj3Free.argtypes = lib.tj3Destroy.argtypes = [vp]
    pixels = np.ascontiguousarray(pixels, dtype=np.uint8)
    h, w, _ = pixels.shape
    handle = lib.tj3Init(0)  # TJINIT_COMPRESS
    try:
        for param, value in ((4, 0), (15, 1), (16, 1)):  # TJPARAM_SUBSAMP 4:4:4, LOSSLESS, LOSSLESSPSV
            lib.tj3Set(handle, param, value)
        buf, size = vp(), ctypes.c_size_t()
        assert lib.tj3Compress8(handle, pixels.ctypes.data, w, w * 3, h, 0, ctypes.byref(buf), ctypes.byref(size)) == 0
        data = ctypes.string_at(buf, size.value)
        lib.tj3Free(buf)
    finally:
        lib.tj3Destroy(handle)
    return data


LOSSLESS_RESIZE = """
import sys
import numpy as np, torch
sys.path.insert(0, {tests!r})
from test_io import _lossless_jpeg, T
from threadloader.images.datagen import photo_like_image
from threadloader.io import decode_image
for h, w, size in ((256, 256, (16, 16)), (64, 96, (16, 24)), (300, 200, (37, 25))):
    pixels = photo_like_image(h, w, 5)
    got = decode_image(_lossless_jpeg(pixels), size=size).to_tensor()
    ref = T.Resize(size, antialias=True)(torch.from_numpy(pixels).permute(2, 0, 1))
    print((got.int() - ref.int()).abs().max().item())
"""


@pytest.mark.skipif(not _turbojpeg.available(), reason="needs the TurboJPEG 3 library to encode lossless JPEGs")
def test_lossless_jpeg_resized_is_decoded_whole_not_scaled() -> None:
    # libjpeg-turbo cannot DCT-scale a lossless JPEG: it wrote full-size rows
    # into the buffer sized for the scaled image (garbage pixels, or a heap
    # overflow that killed the process). In a child: a crash must fail the test, not the suite.
    script = LOSSLESS_RESIZE.format(tests=os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    diffs = [int(v) for v in proc.stdout.split()]
    assert len(diffs) == 3 and max(diffs) <= 1, proc.stdout


@pytest.mark.skipif(not _turbojpeg.available(), reason="needs the TurboJPEG 3 library to encode lossless JPEGs")
def test_lossless_jpeg_crop_is_the_whole_decode_sliced(rgb, jpeg) -> None:
    lossless = _lossless_jpeg(rgb)
    assert _is_lossless_jpeg(lossless) and not _is_lossless_jpeg(jpeg)
    first = 4 + int.from_bytes(lossless[4:6], "big")  # after the first segment: stray bytes, skipped as libjpeg does
    assert _is_lossless_jpeg(lossless[:first] + b"\x00\x11" + lossless[first:])
    assert _is_lossless_jpeg(memoryview(bytearray(lossless)))
    assert not _is_lossless_jpeg(encode(rgb, "JPEG", progressive=True))
    assert np.array_equal(decode_image(lossless).numpy(), rgb)
    # TurboJPEG refuses to crop it: the crop must still decode, not be called corrupt.
    assert np.array_equal(decode_image(lossless, crop=(8, 16, 30, 40)).numpy(), rgb[8:38, 16:56])


def test_region_decoder_is_found_or_cleanly_absent() -> None:
    assert _turbojpeg.available() == (_turbojpeg.library_path() is not None)
    if not _turbojpeg.available():
        with pytest.raises(RuntimeError):
            _turbojpeg.decode_region(b"", 1, (0, 0, 1, 1))


def test_io_package_layout_keeps_public_names() -> None:
    import threadloader.io as tio
    from threadloader.images import arrays, crop
    from threadloader.images import decode as image

    assert sorted(tio.__all__) == sorted(["ImageDecodeError", "Source", "decode_image", "image_size",
                                          "random_resized_crop_params", "RandomResizedCropLoader",
                                          "load_npy", "load_npz"])
    assert tio.decode_image is image.decode_image and tio.image_size is image.image_size
    assert tio.RandomResizedCropLoader is crop.RandomResizedCropLoader
    assert tio.random_resized_crop_params is crop.random_resized_crop_params
    assert tio.load_npy is arrays.load_npy and tio.load_npz is arrays.load_npz
    import threadloader

    assert threadloader.io is tio


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "GIF", "BMP", "WEBP", "TIFF"])
def test_a_decode_leaves_nothing_for_the_garbage_collector(fmt):
    # A reference cycle through the image (PNG's watched reader held it) kept
    # every decoded image until a collection: 15% slower on a 256² PNG.
    import gc

    data = encode(np.random.default_rng(0).integers(0, 256, (40, 30, 3), dtype=np.uint8), fmt)
    decode_image(data)  # imports and caches outside the count
    gc.collect()
    gc.disable()
    try:
        decode_image(data)
        assert gc.collect() == 0
    finally:
        gc.enable()


@pytest.mark.parametrize("fmt", ["PNG", "GIF", "BMP", "WEBP", "TIFF", "JPEG", "PPM", "TGA", "ICO", "JPEG2000"])
def test_formats_told_by_signature_are_the_ones_pillow_identifies(fmt):
    from threadloader.images.decode import _signature_format

    data = encode(np.zeros((16, 16, 3), dtype=np.uint8), fmt)
    told = _signature_format(data)
    assert told in (None, Image.open(io.BytesIO(data)).format)
    assert (told is not None) == (fmt in ("PNG", "GIF", "WEBP", "TIFF"))


# --- the native reader-decoder (threadloader/images/_native.c) -----------------------

needs_native = pytest.mark.skipif(_image_module._native_load is None,
                                  reason="threadloader.images._native not built, or no TurboJPEG 3 library")


def _python_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_image_module, "_native_load", None)


def _outcome(fn):
    try:
        return fn().numpy()
    except Exception as e:  # noqa: BLE001 - compared between the two paths
        return (type(e), str(e))


def _same(a, b) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple) and _image_module.jpeg.__name__ != "simplejpeg":
        # leanjpeg-simple (free-threaded Pythons) keeps the last libjpeg error of
        # its thread: a broken file's header may then parse or fail, worded either way.
        return a[0] is b[0] and a[1].split("': ", 1)[0] == b[1].split("': ", 1)[0]
    if isinstance(a, tuple) or isinstance(b, tuple):
        return a == b
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)


def _varied_files(h: int, w: int, seed: int) -> dict[str, bytes]:
    px = photo_like_image(h, w, seed)
    files = {f"jpeg {sub}": codec.encode_jpeg(px, quality=90, colorspace="RGB", colorsubsampling=sub)
             for sub in ("444", "422", "420", "440")}
    files["progressive"] = encode(px, "JPEG", progressive=True, quality=85)
    files["grey"] = encode(px, "JPEG", "L")
    files["cmyk"] = encode(px, "JPEG", "CMYK")
    files["png"] = encode(px, "PNG")
    files["truncated"] = files["jpeg 420"][: len(files["jpeg 420"]) // 2]
    files["lossless"] = _lossless_jpeg(px) if _turbojpeg.available() else files["jpeg 444"]
    files["not an image"] = b"\xff\xd8\xff" + bytes(40)
    return files


@needs_native
@settings(max_examples=12, deadline=None)
@given(h=st.integers(1, 700), w=st.integers(1, 700), seed=st.integers(0, 2**16),
       size=st.sampled_from([None, (67, 67), (31, 17), (224, 224), (1, 1), 40]),
       reducing_gap=st.sampled_from([2.0, 1.0, None, 3.5]), fast=st.booleans())
def test_native_path_gives_the_python_paths_pixels_and_errors(
    tmp_path_factory, monkeypatch, h, w, seed, size, reducing_gap, fast,
) -> None:
    """Path or bytes, every kind of file: the same pixels (bit for bit) or the same error as the Python path."""
    folder = tmp_path_factory.mktemp("native")
    kw = {"size": size, "reducing_gap": reducing_gap, "fastdct": fast, "fastupsample": fast}
    for name, data in _varied_files(h, w, seed).items():
        path = folder / f"{name.replace(' ', '_')}.jpg"
        path.write_bytes(data)
        for source in (str(path), data):
            native = _outcome(functools.partial(decode_image, source, **kw))
            with monkeypatch.context() as m:
                _python_path(m)
                python = _outcome(functools.partial(decode_image, source, **kw))
            assert _same(native, python), (name, type(source).__name__, kw)


@needs_native
def test_native_path_reads_and_decodes_in_one_call(tmp_path, monkeypatch) -> None:
    """A JPEG path is read and decoded by the native call alone: no Python read, no simplejpeg decode."""
    p = tmp_path / "a.jpg"
    p.write_bytes(codec.encode_jpeg(photo_like_image(112, 149, 1), quality=90, colorspace="RGB"))
    calls = []
    real = _image_module._native_load
    monkeypatch.setattr(_image_module, "_native_load", lambda *a: calls.append(a) or real(*a))
    monkeypatch.setattr(_image_module, "_read_file", lambda *_: pytest.fail("read in Python"))
    monkeypatch.setattr(_image_module, "jpeg", None)  # any simplejpeg call would fail
    frame = decode_image(str(p), size=(67, 67))
    assert len(calls) == 1 and frame.shape == (67, 67, 3)


@needs_native
@pytest.mark.parametrize("size", [0, 1, 4095, 65537, 300_001])
def test_native_reads_hand_back_the_whole_file(tmp_path, size) -> None:
    """What the native call does not decode comes back whole (as _read_file reads it)."""
    p = tmp_path / "f.bin"
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    p.write_bytes(data)
    status, back, pixels, _, _, _ = _image_module._native_load(str(p), 0, 0, 0.0, -1, False, False, bytearray(1))
    assert (status, back, pixels) == (1, data, None)


@needs_native
def test_native_reads_do_not_trust_a_size_of_zero() -> None:
    if not os.path.exists("/proc/self/cmdline"):
        pytest.skip("needs Linux /proc")
    with open("/proc/self/cmdline", "rb") as f:
        expected = f.read()
    assert _image_module._native_load("/proc/self/cmdline", 0, 0, 0.0, -1, False, False, bytearray(1))[1] == expected


@needs_native
def test_native_read_errors_name_the_file_as_the_python_path_does(tmp_path, monkeypatch) -> None:
    sources = [str(tmp_path / "missing.jpg"), str(tmp_path)]
    if os.geteuid() != 0:
        locked = tmp_path / "locked.jpg"
        locked.write_bytes(b"\xff\xd8\xff")
        locked.chmod(0)
        sources.append(str(locked))
    for source in sources:
        native = _outcome(functools.partial(decode_image, source, size=8))
        with monkeypatch.context() as m:
            _python_path(m)
            python = _outcome(functools.partial(decode_image, source, size=8))
        assert native == python and source in native[1]


def _owner(arr: np.ndarray):
    while isinstance(arr, np.ndarray):
        arr = arr.base
    return arr


@needs_native
def test_native_path_recovers_after_any_failure() -> None:
    """A failed header or decode leaves the thread's decompressor usable for the next file."""
    good = codec.encode_jpeg(photo_like_image(50, 60, 5), quality=90, colorspace="RGB")
    expected = codec.decode_jpeg(good, colorspace="RGB")
    for name, bad in _varied_files(40, 50, 6).items():
        with contextlib.suppress(ImageDecodeError):
            decode_image(bad)
        status, _, pixels, h, w, _ = _image_module._native_load(good, 0, 0, 0.0, -1, False, False, bytearray(1))
        assert status == 0 and np.array_equal(np.frombuffer(pixels, np.uint8).reshape(h, w, 3), expected), name


@needs_native
def test_native_decodes_into_pooled_memory_sized_by_the_guess(monkeypatch) -> None:
    """A larger image than the guess gets memory of its own, and sets the guess for the next."""
    from threadloader.images.buffers import decode_pool

    small = codec.encode_jpeg(photo_like_image(40, 50, 2), quality=90, colorspace="RGB")
    big = codec.encode_jpeg(photo_like_image(300, 400, 3), quality=90, colorspace="RGB")
    expected = codec.decode_jpeg(big, colorspace="RGB")
    monkeypatch.setattr(_image_module, "_guess", _image_module._SizeGuess())  # no size learnt yet
    first = decode_image(big)
    lent = decode_pool.stats()["lent"]
    second = decode_image(big)  # into a pooled block now
    new_loans = decode_pool.stats()["lent"] - lent
    tiny = decode_image(small)  # into a block of the big one's size: the guess does not shrink at once
    assert np.array_equal(first.numpy(), expected) and np.array_equal(second.numpy(), expected)
    assert new_loans == 1  # the second's block (the one the first call took, unused, is back)
    assert _owner(first.numpy()).__class__.__name__ == "Pixels" and isinstance(_owner(second.numpy()), memoryview)
    assert first.numpy().flags.writeable and second.numpy().flags.writeable
    assert np.array_equal(tiny.numpy(), codec.decode_jpeg(small, colorspace="RGB"))
    assert isinstance(_owner(tiny.numpy()), memoryview)
    assert _image_module._guess.nbytes == expected.nbytes


def test_without_the_native_part_the_python_path_decodes(monkeypatch) -> None:
    """Not built (ImportError), turned off, or no TurboJPEG library: _bind_native gives None and decoding works."""
    import builtins

    real_import = builtins.__import__

    def no_native(name, globals=None, locals=None, fromlist=(), level=0):
        if fromlist and "_native" in fromlist:
            raise ImportError("not built")
        return real_import(name, globals, locals, fromlist, level)

    with monkeypatch.context() as m:
        m.setattr(builtins, "__import__", no_native)
        assert _image_module._bind_native() is None
    with monkeypatch.context() as m:
        m.setenv("THREADLOADER_NATIVE", "0")
        assert _image_module._bind_native() is None
    with monkeypatch.context() as m:
        m.setattr(_turbojpeg, "library_path", lambda: None)
        assert _image_module._bind_native() is None
    _python_path(monkeypatch)
    data = codec.encode_jpeg(photo_like_image(30, 40, 4), quality=90, colorspace="RGB")
    assert np.array_equal(decode_image(data).numpy(), codec.decode_jpeg(data, colorspace="RGB"))


@pytest.mark.skipif(not sys.platform.startswith("linux") or sys.implementation.name != "cpython",
                    reason="the native part is built on Linux CPython")
def test_the_native_part_is_built_where_it_can_be() -> None:
    """optional=True hides a failed build: here (gcc and headers present) it must have built and bound."""
    if not _turbojpeg.available():
        pytest.skip("no TurboJPEG 3 library: nothing to bind")
    if os.environ.get("THREADLOADER_NATIVE") == "0":
        pytest.skip("turned off by THREADLOADER_NATIVE=0")
    try:
        from threadloader.images import _native  # noqa: F401
    except ImportError as e:
        pytest.fail(f"threadloader.images._native is not built ({e}): pip install -e . builds it "
                    f"(or python setup.py build_ext --inplace in a checkout)")
    assert _image_module._native_load is not None


def test_the_native_buffer_guess_is_the_largest_size_of_the_last_window() -> None:
    """Scattered sizes fit the guessed block (one pooled size, reused); a rare large image is forgotten."""
    guess = _image_module._SizeGuess()
    window = _image_module._GUESS_WINDOW
    guesses = []
    for n in [100, 120, 90, 110] * (window // 4) + [70] * window + [50] * window + [60] * window:
        guesses.append(guess.nbytes)
        guess.learn(n)
    assert guesses[:4] == [1, 100, 120, 120]  # grows at once
    assert set(guesses[window:3 * window]) == {120}  # kept: 70 is over half of it
    assert guesses[3 * window:3 * window + 2] == [50, 60]  # a window all under half: forgotten
    guess.learn(_image_module._GUESS_CAP + 1)  # over the cap: never the guess
    assert guess.nbytes == 60
