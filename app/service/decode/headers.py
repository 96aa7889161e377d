"""An image's header: what its header and metadata may cost, checked before Pillow reads
them, and the format its first bytes name (``sniff_format``, for the 415 of a format that
is not accepted).

Pillow walks a JPEG's markers, a PNG's chunks and a GIF's extension blocks one at a time in
Python, keeping every metadata segment: 2 M empty APP15 segments (8 MB) cost 5.7 s and
260 MiB in ``Image.open`` alone, before any pixel limit applies. Here the same structure is
walked first, at one step per segment or chunk (``bytes.find``, ``struct``), and an image
is refused at the first bound crossed, so this check costs at most its limits. The bounds
sit far above what real images carry (a camera JPEG has about ten segments before its
scan, a large ICC profile 255 APP2 chunks; libpng writes one IDAT chunk per 8 KiB).
"""

from __future__ import annotations

import io
import struct

from PIL import Image, PngImagePlugin

from app import errors

MAX_JPEG_HEADER_STEPS = 1024
"""Segments, fill bytes and stray bytes before a JPEG's first scan (Pillow reads each)."""
MAX_JPEG_SCANS = 256
"""Start-of-scan markers in a JPEG (a progressive JPEG has about ten; each is a full pass
of libjpeg over the image's coefficients)."""
MAX_JPEG_SCAN_PIXELS = 16 * 4096 * 4096
"""Scans times pixels of a JPEG: libjpeg entropy-decodes every scan over the whole image,
whatever the draft scale, so that product is what a JPEG costs. A 4096² image (the
LAD_MAX_IMAGE_PIXELS default) may have 16 scans (libjpeg writes 10 for a progressive
colour image); 256 scans of 4096² took 1.9 s each, 14 times their 10-scan twins."""
MAX_PNG_CHUNKS = 16_384
"""Chunks of a PNG, image data included (8 MB at libpng's 8 KiB per IDAT is 1,024)."""
MAX_PNG_TEXT_CHUNKS = 512
"""tEXt, zTXt and iTXt chunks of a PNG (each is decoded into ``info``)."""
MAX_PNG_ICC_PROFILES = 1
"""iCCP chunks of a PNG (the PNG specification allows one; Pillow inflates each, up to
1 MiB: 7,936 of 1 KB took 17.7 s)."""
MAX_PNG_COMPRESSED_CHUNK_BYTES = 1024 * 1024
"""Compressed data of one ancillary chunk Pillow inflates (iCCP, zTXt, iTXt): an ICC
profile compresses to a few KiB, the largest to a few hundred."""
MAX_EXIF_BYTES = 65_535
"""EXIF block of a PNG (eXIf) or a WebP: what a JPEG's APP1 segment can hold. Reading the
orientation parses the whole first directory, and a 0.4 MB one made Pillow warn 30,000
times."""

# Markers Pillow reads without a length (JPG, RST0-7, SOI, EOI, JPG0-13): it goes on past them.
MAX_GIF_BLOCKS = 65_536
"""Extension sub-blocks of a GIF before its first frame (Pillow reads each: 3 M one-byte
comment sub-blocks took it 4 s; an XMP packet of 1 MB is about 16,000)."""
MAX_WEBP_CHUNKS = 16_384
"""RIFF chunks of a WebP (an animation's frames included)."""
MAX_PNG_TEXT_BYTES = 4 * 1024 * 1024
"""Decompressed text of one PNG, all chunks together (Pillow's MAX_TEXT_MEMORY, 64 MiB by
default: twelve images of a request are opened at once)."""
PngImagePlugin.MAX_TEXT_MEMORY = MAX_PNG_TEXT_BYTES

_NO_LENGTH = frozenset({0xC8, *range(0xD0, 0xDA), *range(0xF0, 0xFE)})
_TEXT_CHUNKS = frozenset({b"tEXt", b"zTXt", b"iTXt"})
_COMPRESSED_CHUNKS = frozenset({b"iCCP", b"zTXt", b"iTXt"})
# Start-of-frame markers (C0-CF but DHT C4, JPG C8, DAC CC): they carry the image's size.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _refuse(where: str, what: str) -> errors.UnsupportedImage:
    return errors.UnsupportedImage(f"{where} has {what}; no real image needs that many")


def check_jpeg(raw: bytes, where: str) -> None:
    """Walk a JPEG's markers up to its first scan as Pillow does, within the bounds."""
    steps, pos, end, pixels = 0, 2, len(raw), 0
    while pos + 1 < end:
        if raw[pos] != 0xFF:  # stray bytes: Pillow skips them one by one
            found = raw.find(b"\xff", pos)
            found = end if found < 0 else found
            steps += found - pos
            pos = found
        else:
            marker = raw[pos + 1]
            if marker == 0xDA or 0x00 < marker < 0xC0:  # start of scan, or Pillow refuses it
                break
            steps += 1
            if marker in (0xFF, 0x00) or marker in _NO_LENGTH:
                pos += 1 if marker == 0xFF else 2
            elif pos + 4 > end:
                break  # truncated: Pillow refuses it
            else:
                if marker in _SOF and pos + 9 <= end:
                    height, width = struct.unpack_from(">HH", raw, pos + 5)
                    pixels = max(pixels, height * width)
                pos += 2 + max(struct.unpack_from(">H", raw, pos + 2)[0], 2)
        if steps > MAX_JPEG_HEADER_STEPS:
            raise _refuse(where, f"over {MAX_JPEG_HEADER_STEPS} header segments or fill bytes")
    scans = raw.count(b"\xff\xda")  # entropy-coded data never holds FF DA (FF is stuffed)
    if scans > MAX_JPEG_SCANS:
        raise _refuse(where, f"{scans} scans (at most {MAX_JPEG_SCANS})")
    if scans * pixels > MAX_JPEG_SCAN_PIXELS:
        raise errors.UnsupportedImage(
            f"{where} has {scans} scans of {pixels} pixels; scans x pixels is at most "
            f"{MAX_JPEG_SCAN_PIXELS} (MAX_JPEG_SCAN_PIXELS: 16 scans of 4096x4096)"
        )


def check_png(raw: bytes, where: str) -> None:
    """Walk a PNG's chunks (Pillow reads them before and after the image data)."""
    chunks = texts = profiles = 0
    pos, end = 8, len(raw)
    while pos + 8 <= end:
        length, kind = struct.unpack_from(">I4s", raw, pos)
        chunks += 1
        if chunks > MAX_PNG_CHUNKS:
            raise _refuse(where, f"over {MAX_PNG_CHUNKS} chunks")
        if kind in _TEXT_CHUNKS:
            texts += 1
            if texts > MAX_PNG_TEXT_CHUNKS:
                raise _refuse(where, f"over {MAX_PNG_TEXT_CHUNKS} text chunks")
        elif kind == b"eXIf" and length > MAX_EXIF_BYTES:
            raise _refuse(where, f"an EXIF block of {length} bytes (at most {MAX_EXIF_BYTES})")
        if kind == b"iCCP":
            profiles += 1
            if profiles > MAX_PNG_ICC_PROFILES:
                raise errors.UnsupportedImage(
                    f"{where} has more than {MAX_PNG_ICC_PROFILES} iCCP chunk "
                    "(MAX_PNG_ICC_PROFILES; the PNG specification allows one)"
                )
        if kind in _COMPRESSED_CHUNKS and length > MAX_PNG_COMPRESSED_CHUNK_BYTES:
            raise errors.UnsupportedImage(
                f"{where} has a compressed {kind.decode('latin-1')} chunk of {length} bytes; "
                f"at most {MAX_PNG_COMPRESSED_CHUNK_BYTES} (MAX_PNG_COMPRESSED_CHUNK_BYTES)"
            )
        if kind == b"IEND":
            return
        pos += 12 + length


def check_gif(raw: bytes, where: str) -> None:
    """Walk a GIF's extension blocks up to its first image descriptor."""
    if len(raw) < 13:
        return
    flags = raw[10]
    pos = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
    steps, end = 0, len(raw)
    while pos < end and raw[pos] == 0x21:  # an extension: label, then sub-blocks to a 0
        pos += 2
        while True:
            steps += 1
            if steps > MAX_GIF_BLOCKS:
                raise _refuse(where, f"over {MAX_GIF_BLOCKS} extension blocks")
            if pos >= end or not raw[pos]:
                break
            pos += 1 + raw[pos]
        pos += 1


def check_webp(raw: bytes, where: str) -> None:
    """Walk a WebP's RIFF chunks: their count, and its EXIF block's size."""
    chunks, pos, end = 0, 12, len(raw)
    while pos + 8 <= end:
        kind, length = struct.unpack_from("<4sI", raw, pos)
        chunks += 1
        if chunks > MAX_WEBP_CHUNKS:
            raise _refuse(where, f"over {MAX_WEBP_CHUNKS} chunks")
        if kind == b"EXIF" and length > MAX_EXIF_BYTES:
            raise _refuse(where, f"an EXIF block of {length} bytes (at most {MAX_EXIF_BYTES})")
        pos += 8 + length + (length & 1)


def check_header(raw: bytes, where: str) -> None:
    """Bound the header and metadata work of a JPEG, PNG, GIF or WebP (others: nothing)."""
    if raw[:3] == b"\xff\xd8\xff":
        check_jpeg(raw, where)
    elif raw[:8] == b"\x89PNG\r\n\x1a\n":
        check_png(raw, where)
    elif raw[:4] == b"GIF8":
        check_gif(raw, where)
    elif raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
        check_webp(raw, where)


# Leading bytes of formats that are refused by name (415) rather than as unreadable (400).
_SIGNATURES: tuple[tuple[bytes, int, str], ...] = (
    (b"\xff\xd8\xff", 0, "JPEG"),
    (b"\x89PNG\r\n\x1a\n", 0, "PNG"),
    (b"GIF8", 0, "GIF"),
    (b"WEBP", 8, "WEBP"),
    (b"BM", 0, "BMP"),
    (b"II*\x00", 0, "TIFF"),
    (b"MM\x00*", 0, "TIFF"),
    (b"%PDF", 0, "PDF"),
    (b"%!PS", 0, "PostScript/EPS"),
    (b"\xc5\xd0\xd3\xc6", 0, "EPS"),
    (b"8BPS", 0, "PSD"),
    (b"\x00\x00\x01\x00", 0, "ICO"),
    (b"ftypheic", 4, "HEIC"),
    (b"ftypheix", 4, "HEIC"),
    (b"ftypmif1", 4, "HEIF"),
    (b"ftypavif", 4, "AVIF"),
    (b"\x00\x00\x00\x0cjP  ", 0, "JPEG 2000"),
    (b"\xffO\xffQ", 0, "JPEG 2000"),
    (b"qoif", 0, "QOI"),
    (b"DDS ", 0, "DDS"),
    (b"v/1\x01", 0, "OpenEXR"),
)


_NAMED_BY_PILLOW = ("PPM", "PCX", "TGA", "SGI", "XBM", "ICNS")
"""Formats without a fixed signature (TGA has none) that Pillow names from their header
alone (their ``open`` reads a few bytes, never pixels); an image in one is refused by name
(415) like the signatures above."""


def sniff_format(raw: bytes) -> str | None:
    """The format named by the first bytes (None if not recognised); never decodes."""
    for magic, offset, name in _SIGNATURES:
        if raw[offset : offset + len(magic)] == magic:
            return name
    head = raw[:256].lstrip().lower()
    if head.startswith((b"<svg", b"<?xml", b"<!doctype svg")):
        return "SVG"
    try:
        with Image.open(io.BytesIO(raw), formats=_NAMED_BY_PILLOW) as image:
            return str(image.format)
    except Exception:  # not one of them: an unreadable image
        return None
