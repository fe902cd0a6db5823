"""What a JPEG's bytes say before (or besides) decoding: its frame type, whether its scans end, and
which of libjpeg's warnings leave the pixels whole.

The marker walks skip segment payloads by their lengths (EXIF, ICC or
thumbnail data may hold any bytes, so a search would be fooled) and stray
bytes between segments, as libjpeg does.
"""

from __future__ import annotations

from typing import Any, Iterator

__all__ = ["is_complete", "is_harmless_warning", "is_lossless"]

#: Start-of-frame markers (SOFn): all of 0xC0..0xCF but DHT, JPG and DAC.
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
#: Those of the lossless process (SOF3, SOF7, SOF11, SOF15).
_LOSSLESS_SOF_MARKERS = frozenset({0xC3, 0xC7, 0xCB, 0xCF})


def _as_bytes_like(data: Any) -> Any:
    return data if type(data) is bytes else memoryview(data).cast("B")


def _segments(data: Any) -> Iterator[tuple[int, int]]:
    """``(marker, index just past its segment)`` for each marker of a JPEG's header, in file order.

    Ends after the first start of scan (0xDA: what follows is entropy-coded
    data) or end of image (0xD9), or at the end of ``data``.
    """
    n, i = len(data), 2
    while i + 4 <= n:
        if data[i] != 0xFF:  # stray bytes between segments: libjpeg skips to the next 0xFF
            i += 1
            continue
        marker = data[i + 1]
        if marker == 0xFF:  # a fill byte
            i += 1
            continue
        if 0xD0 <= marker <= 0xD7 or marker == 0x01 or marker == 0xD9:  # markers without a length
            i += 2
        else:
            i += 2 + ((data[i + 2] << 8) | data[i + 3])
        yield marker, i
        if marker == 0xDA or marker == 0xD9:
            return


def is_lossless(data: Any) -> bool:
    """Whether a JPEG's frame is lossless, read from its markers up to the start of frame."""
    for marker, _ in _segments(_as_bytes_like(data)):
        if marker in _SOF_MARKERS:
            return marker in _LOSSLESS_SOF_MARKERS
    return False  # a scan or the end of the image came first: no frame header met


def is_complete(data: Any) -> bool:
    """Whether a JPEG has an end-of-image marker after its first scan begins (a truncation check).

    Header segments are walked by their lengths to the first start of scan;
    after it, only the end of the image puts 0xFF 0xD9 in the file
    (entropy-coded data cannot hold it, a damaged scan aside). Bytes after
    that marker (a Motion Photo's video, any trailer) are not looked at:
    libjpeg reads none, and they may hold marker-like bytes.
    """
    raw = data if type(data) is bytes else bytes(data)
    for marker, end in _segments(raw):
        if marker == 0xDA:
            # Searched from the file's end, where the marker is: the same
            # answer as from the scan's start, without reading the scan
            # (its 0xFF stuffing slows a search through it).
            return raw.rfind(b"\xff\xd9", end) >= 0
    return False  # an end before any scan (nothing to decode), or no scan at all


#: libjpeg warnings about bytes the decoder skips or ignores: the image is
#: decoded whole (Pillow gives the same pixels as for the file without them).
#: The others (a premature end, corrupt entropy-coded data) mean missing or
#: damaged pixels and stay errors.
_HARMLESS_WARNINGS = (
    "extraneous bytes before marker",  # JWRN_EXTRANEOUS_DATA: stray bytes between segments
    "unknown JFIF revision",  # JWRN_JFIF_MAJOR
    "Unknown Adobe color transform",  # JWRN_ADOBE_XFORM
    "bad ICC marker",  # JWRN_BOGUS_ICC: the colour profile is ignored
)


def is_harmless_warning(message: str) -> bool:
    """Whether a strict decode's error is one of libjpeg's warnings that leave the pixels whole."""
    return any(w.lower() in message.lower() for w in _HARMLESS_WARNINGS)
