"""Requests that cost far more than their size (issue 19), built in one place for the
hostile tests and ``lad bench hardening``: JSON floods, images whose headers and metadata
are the expensive part, multipart bodies that never close."""

from __future__ import annotations

import io
import struct
import zlib

from PIL import Image


def small_image(fmt: str, side: int = 32) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (side, side), "red").save(buffer, format=fmt)
    return buffer.getvalue()


def json_unknown_keys(keys: int) -> bytes:
    """A retrieve body with ``keys`` unknown keys (3 M: the probe's 36 MB body)."""
    return (
        b'{"query": "x", "images": ["a", "b"]'
        + b"".join(b', "k%07d": 1' % i for i in range(keys))
        + b"}"
    )


def jpeg_with_app_segments(segments: int, marker: int = 0xEF) -> bytes:
    """A 32x32 JPEG with ``segments`` empty APPn segments after its SOI (2 M: 8 MB)."""
    raw = small_image("JPEG")
    return raw[:2] + bytes((0xFF, marker, 0x00, 0x02)) * segments + raw[2:]


def progressive_jpeg_with_scans(side: int, scans: int) -> bytes:
    """A progressive ``side``² JPEG (libjpeg's 10 scans) with empty start-of-scan markers
    added before its end to make ``scans`` in all (256 at 4096²: the probe's 7.5 s)."""
    buffer = io.BytesIO()
    Image.effect_noise((side, side), 40).convert("RGB").save(
        buffer, format="JPEG", progressive=True, quality=50
    )
    raw = buffer.getvalue()
    extra = max(scans - raw.count(b"\xff\xda"), 0)
    return raw[:-2] + b"\xff\xda\x00\x02" * extra + raw[-2:]


def png_with_icc_profiles(count: int, inflated: int = 1024 * 1024) -> bytes:
    """A 32x32 PNG with ``count`` iCCP chunks, each about 1 KB that inflates to ``inflated``
    bytes (7,936 of them: the probe's 8 MB PNG that took 17.7 s)."""
    return png_with_chunks(b"iCCP", b"icc\x00\x00" + zlib.compress(bytes(inflated), 9), count)


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_with_chunks(kind: bytes, data: bytes, count: int) -> bytes:
    """A 32x32 PNG with ``count`` copies of one chunk after its header chunk."""
    raw = small_image("PNG")
    ihdr_end = 8 + 25
    return raw[:ihdr_end] + png_chunk(kind, data) * count + raw[ihdr_end:]


def exif_with_broken_tags(tags: int) -> bytes:
    """An EXIF block (big-endian TIFF) whose ``tags`` entries all point past its end:
    reading it makes Pillow warn once per tag, each with its own message."""
    entries = b"".join(
        struct.pack(">HHLL", (0x1000 + i) & 0xFFFF, 7, 1 << 30, 8) for i in range(tags)
    )
    return b"MM\x00\x2a" + struct.pack(">LH", 8, tags) + entries + b"\x00\x00\x00\x00"


def png_with_exif(exif: bytes) -> bytes:
    """A 32x32 PNG carrying ``exif`` in an eXIf chunk."""
    return png_with_chunks(b"eXIf", exif, 1)


def multipart_form(
    boundary: bytes, images: list[bytes], *, close: bool = True, cut: int = 0
) -> bytes:
    """A retrieve form (query, method=vanilla, the images); ``close=False`` leaves out the
    closing boundary, ``cut`` drops that many bytes from the end."""
    parts = [
        b'--%s\r\nContent-Disposition: form-data; name="query"\r\n\r\na red square\r\n' % boundary,
        b'--%s\r\nContent-Disposition: form-data; name="method"\r\n\r\nvanilla\r\n' % boundary,
    ]
    for i, image in enumerate(images):
        parts.append(
            b'--%s\r\nContent-Disposition: form-data; name="images"; '
            b'filename="%d.png"\r\nContent-Type: image/png\r\n\r\n'
            % (boundary, i)
            + image
            + b"\r\n"
        )
    if close:
        parts.append(b"--%s--\r\n" % boundary)
    body = b"".join(parts)
    return body[: len(body) - cut]


def gif_with_comment_blocks(blocks: int) -> bytes:
    """A 32x32 GIF with a comment extension of ``blocks`` one-byte sub-blocks."""
    raw = small_image("GIF")
    frame = raw.index(b"\x2c")  # the image descriptor (a 1-colour GIF holds no 0x2C before)
    return raw[:frame] + b"\x21\xfe" + b"\x01x" * blocks + b"\x00" + raw[frame:]


def webp_with_exif(exif: bytes) -> bytes:
    """A 32x32 WebP carrying ``exif``."""
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), "red").save(buffer, format="WEBP", exif=b"Exif\x00\x00" + exif)
    return buffer.getvalue()
