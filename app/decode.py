"""The decode stage: wire input -> engine input, within the operator's limits.

Runs before the queue (off the event loop), so a bad image or query is refused with
a 4xx before it can take a place in the batch.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Sequence

from PIL import Image, UnidentifiedImageError

from app import errors
from app.engine.labels import resolve_labels
from app.settings import Settings

ImageInput = str | bytes


def decode_image(data: ImageInput, where: str, settings: Settings) -> Image.Image:
    """Base64 (data URL or bare) or raw bytes -> RGB PIL image, within the size limits."""
    if isinstance(data, str):
        text = data.strip()
        if text.startswith("data:"):
            header, sep, text = text.partition(",")
            if not sep or not header[5:].startswith("image/") or ";base64" not in header:
                raise errors.InvalidImage(f"{where}: expected data:image/<type>;base64,<data>")
        text = "".join(text.split())
        if len(text) * 3 // 4 > settings.max_image_bytes + 3:
            raise errors.ImageTooLarge(
                f"{where} is larger than LAD_MAX_IMAGE_BYTES={settings.max_image_bytes} bytes"
            )
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise errors.InvalidImage(f"{where} is not valid base64") from None
    else:
        raw = data
    if not raw:
        raise errors.InvalidImage(f"{where} is empty")
    if len(raw) > settings.max_image_bytes:
        raise errors.ImageTooLarge(
            f"{where} has {len(raw)} bytes; the limit is LAD_MAX_IMAGE_BYTES="
            f"{settings.max_image_bytes}"
        )
    try:
        with Image.open(io.BytesIO(raw)) as probe:
            width, height = probe.size
            if width * height > settings.max_image_pixels:
                raise errors.ImageTooLarge(
                    f"{where} is {width}x{height} pixels; the limit is "
                    f"LAD_MAX_IMAGE_PIXELS={settings.max_image_pixels}"
                )
            probe.verify()
        with Image.open(io.BytesIO(raw)) as image:
            return image.convert("RGB")
    except Image.DecompressionBombError:
        raise errors.ImageTooLarge(f"{where} is a decompression bomb") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError) as exc:
        raise errors.InvalidImage(f"{where} is not a readable image ({exc})") from None


def check_query(query: str, settings: Settings, where: str = "query") -> str:
    if not query.strip():
        raise errors.InvalidQuery(f"{where} is empty")
    if len(query) > settings.max_query_chars:
        raise errors.InvalidQuery(
            f"{where} has {len(query)} characters; LAD_MAX_QUERY_CHARS={settings.max_query_chars}"
        )
    return query


def check_candidates(
    n: int, labels: str | Sequence[str], settings: Settings, where: str = "images"
) -> list[str]:
    """N within limits and a label scheme that can name N images; returns the labels."""
    if n < 2:
        raise errors.TooFewImages(f"{where} has {n} image(s); retrieval needs N >= 2 candidates")
    if n > settings.max_images:
        raise errors.TooManyImages(
            f"{where} has {n} images; the limit is LAD_MAX_IMAGES={settings.max_images}"
        )
    try:
        return resolve_labels(labels, n)
    except ValueError as exc:
        raise errors.InvalidLabels(str(exc)) from None
