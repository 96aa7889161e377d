"""The decoder of the decode stage: wire input -> engine input, within the operator's
limits, at bounded cost.

Runs before the queue (off the event loop), so a bad image or query is refused with a 4xx
before it can take a place in a batch. The cost of a request is bounded before any pixel
is decoded: every image's header is read first (format allowlist, size, aspect ratio, the
request's decoded-pixel budget), then each image is decoded at the smallest scale that
still covers the model's own image budget (the processor's max pixels): JPEGs through
Pillow's draft mode (a 4096² JPEG decodes at 512²), everything else decoded once and
resized once, straight to that budget, or straight to the processor's own input size
when the model names it (Qwen: sides multiples of 28). The processor then has nothing
left to shrink.
The two steps are apart (``encoded``: every header checked, no pixel decoded; ``decode``:
the pixels), so a rerank keeps its documents as their bytes and decodes one batch of
windows at a time; ``images`` is both at once (retrieve, calibrate).
Only the small result is kept; at most `LAD_MAX_CONCURRENT_DECODES` requests decode at once,
their images on `LAD_DECODE_THREADS` shared threads (Pillow releases the GIL while it
decodes, so the images of one large request decode in parallel), so at most that many
full-size images are in memory at any moment.

Conversions, so the model sees what a person sees: EXIF orientation applied; transparent
pixels (RGBA, LA, palette with transparency) composited on white; CMYK converted to RGB
(without colour management); 16-bit images scaled to 8 bits; GIF and WebP animations give
their first frame. An aspect ratio beyond `LAD_MAX_ASPECT_RATIO` is refused (422), not
padded or cropped, so that the answer is about the image the client sent.
"""

from __future__ import annotations

import asyncio
import binascii
import io
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import asynccontextmanager
from dataclasses import dataclass

import numpy as np
from PIL import Image

from app import errors
from app.budget import ACCOUNT, PIXEL_BYTES, Account, ByteBudget
from app.engine.host_memory import release_free_memory
from app.engine.labels import Labels, LabelSpec, parse_labels
from app.service.decode.headers import check_header, sniff_format
from app.settings import Settings

log = logging.getLogger(__name__)

THREADED_PIXELS = 1_000_000
"""Decoded pixels of a request (after draft scaling) from which its images go to the decode
threads: below it, decoding costs less than handing the images over."""

TRIM_AFTER_BYTES = 16 * 1024 * 1024
"""A JSON body, or a request's encoded images, from this size on is followed by
``release_free_memory`` (after the parse, after the decode)."""

ImageInput = str | bytes

_DATA_URL_HEADER = re.compile(r"data:image/[A-Za-z0-9.+-]+(;[A-Za-z0-9=._+-]*)*;base64", re.ASCII)
_WHITESPACE = re.compile(r"\s+")
_REMOTE_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,15}://")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# In a label, which answers and logs echo: every C0/C1 control (tabs and line breaks too:
# a label is one line) and the bidirectional controls that make text read otherwise than
# it is stored (U+061C, U+200E-200F, U+202A-202E, U+2066-2069).
_LABEL_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_ORIENTATION = 0x0112
_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


def target_size(width: int, height: int, budget: int | None) -> tuple[int, int]:
    """The largest size with the same aspect ratio and at most ``budget`` pixels (never
    larger than the image; None = keep the size). The short side is rounded first so the
    aspect ratio survives rounding."""
    if budget is None or width * height <= budget:
        return width, height
    scale = math.sqrt(budget / (width * height))
    if width >= height:
        short = max(1, round(height * scale))
        long_ = max(1, min(round(short * width / height), budget // short))
        return long_, short
    short = max(1, round(width * scale))
    long_ = max(1, min(round(short * height / width), budget // short))
    return short, long_


def is_url(value: object) -> bool:
    """Whether an image input names its image by URL (for the fetch stage to fetch or
    refuse: app/service/decode/media.py) rather than carrying it."""
    return isinstance(value, str) and _REMOTE_URL.match(value.lstrip()) is not None


def _to_bytes(data: ImageInput, where: str, settings: Settings) -> bytes:
    """Base64 (data URL or bare) or raw bytes -> encoded image bytes, within the byte limit."""
    if not isinstance(data, str):
        raw = bytes(data)
    else:
        text = data.strip()  # the same object when there is nothing to strip
        if is_url(text):  # the fetch stage replaced every URL it may fetch (media.py)
            raise errors.MediaNotAllowed(f"{where} is a URL, which is not fetched here")
        if text[:5] == "data:":
            comma = text.find(",", 0, 256)
            if comma < 0 or not _DATA_URL_HEADER.fullmatch(text, 0, comma):
                raise errors.InvalidImage(f"{where}: expected data:image/<type>;base64,<data>")
            text = text[comma + 1 :]
        if len(text) * 3 // 4 > settings.max_image_bytes + 3:
            raise errors.ImageTooLarge(
                f"{where} is larger than LAD_MAX_IMAGE_BYTES={settings.max_image_bytes} bytes"
            )
        try:
            raw = binascii.a2b_base64(text, strict_mode=True)
        except (binascii.Error, ValueError):
            try:  # line-wrapped base64 is common; strip whitespace only when needed
                raw = binascii.a2b_base64(_WHITESPACE.sub("", text), strict_mode=True)
            except (binascii.Error, ValueError):
                raise errors.InvalidImage(f"{where} is not valid base64") from None
    if not raw:
        raise errors.InvalidImage(f"{where} is empty")
    if len(raw) > settings.max_image_bytes:
        raise errors.ImageTooLarge(
            f"{where} has {len(raw)} bytes; the limit is LAD_MAX_IMAGE_BYTES="
            f"{settings.max_image_bytes}"
        )
    return raw


def _to_8bit(image: Image.Image) -> Image.Image:
    """Modes the resampler and the processor do not take -> L, RGB, RGBA, LA or CMYK."""
    mode = image.mode
    if mode.startswith("I") or mode == "F":
        pixels = np.asarray(image)
        if mode == "F":
            small = np.clip(pixels, 0, 255).astype(np.uint8)
        else:  # 16-bit samples (I;16*, or I holding 0..65535): keep the top 8 bits
            small = (np.clip(pixels, 0, 65535) >> 8).astype(np.uint8)
        return Image.fromarray(small)  # uint8 (H, W) -> mode L
    if mode in ("P", "PA"):
        has_alpha = mode == "PA" or "transparency" in image.info
        return image.convert("RGBA" if has_alpha else "RGB")
    if mode == "1":
        return image.convert("L")
    if mode in ("RGBa", "La"):
        return image.convert("RGBA")
    if mode not in ("L", "LA", "RGB", "RGBA", "CMYK", "YCbCr"):
        return image.convert("RGBA" if "A" in mode else "RGB")
    return image


def _to_rgb(image: Image.Image) -> Image.Image:
    """RGB for the model: transparent pixels on white, other modes converted."""
    if image.mode in ("RGBA", "LA"):
        rgba = image.convert("RGBA")
        out = Image.new("RGB", rgba.size, (255, 255, 255))
        out.paste(rgba, mask=rgba.getchannel("A"))
        return out
    return image if image.mode == "RGB" else image.convert("RGB")


def parse_label_text(text: str) -> LabelSpec:
    """A labels value sent as text (a form field, a profile route's query parameter): a
    scheme name, a stored ``custom:<hash>``, a JSON list or a comma list. The one place label
    text is read; text that names no labels is 422 ``invalid_labels``."""
    try:
        return parse_labels(text)
    except ValueError as exc:
        raise errors.InvalidLabels(f"labels {text[:80]!r}: {str(exc)[:200]}") from None


@dataclass(frozen=True)
class EncodedImage:
    """One image as received: its encoded bytes, its header checked, not yet decoded (a
    rerank keeps every document so and decodes a window's images when its round runs)."""

    raw: bytes
    where: str
    pixels: int
    """The pixels decoding it holds at once (its size after JPEG draft reduction)."""
    size: tuple[int, int]
    """The size it is decoded to (chosen once, from its header)."""


class _Probe:
    """An opened (header-only) image with its checks done and its decode size chosen."""

    def __init__(self, image: Image.Image, where: str, size: tuple[int, int]) -> None:
        self.image, self.where, self.size = image, where, size

    @property
    def decoded_pixels(self) -> int:
        return self.image.size[0] * self.image.size[1]


class Decoder:
    """The decode stage of one service: limits from the settings, the model's image budget,
    the model's special tokens (refused in user text) and the bound on concurrent decodes."""

    def __init__(
        self,
        settings: Settings,
        *,
        pixel_budget: int | None = None,
        special_tokens: Sequence[str] = (),
        image_size: Callable[[int, int], tuple[int, int] | None] | None = None,
    ) -> None:
        self.settings = settings
        self.pixel_budget = pixel_budget
        self.image_size = image_size  # the processor's exact size for an image, if known
        self.formats = tuple(settings.image_formats)
        tokens = sorted({t for t in special_tokens if t}, key=len, reverse=True)
        self._special = re.compile("|".join(map(re.escape, tokens))) if tokens else None
        # shared with the body guard; one image decoded at its largest always fits
        self.budget = ByteBudget(
            settings.max_inflight_bytes, headroom=PIXEL_BYTES * settings.max_image_pixels
        )
        self._slots: asyncio.Semaphore | None = None
        self._threads: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ concurrency
    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of LAD_MAX_CONCURRENT_DECODES decode slots (waiting costs no thread)."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.settings.max_concurrent_decodes)
        await self._slots.acquire()
        try:
            yield
        finally:
            self._slots.release()

    # ------------------------------------------------------------------ images
    def images(
        self, inputs: Sequence[ImageInput], where: str, timings: dict[str, float] | None = None
    ) -> list[Image.Image]:
        """Decode a request's images (call inside `slot()`, off the event loop): ``encoded``
        then ``decode``, all of them at once. ``timings`` (if given) receives ``base64``:
        the milliseconds of the base64 step alone."""
        encoded = self.encoded(inputs, where, timings)
        try:
            return self.decode(encoded, where)
        finally:
            if sum(len(e.raw) for e in encoded) >= TRIM_AFTER_BYTES:
                release_free_memory()

    def encoded(
        self, inputs: Sequence[ImageInput], where: str, timings: dict[str, float] | None = None
    ) -> list[EncodedImage]:
        """Every image's bytes (base64 decoded) with its header checked (format, size,
        aspect ratio, the bomb guards) and its decode size known, no pixel decoded: a bad
        image is refused here, before any forward pass. ``timings`` as in ``images``."""
        start = time.perf_counter()
        raws = [_to_bytes(data, f"{where}[{i}]", self.settings) for i, data in enumerate(inputs)]
        if timings is not None:
            timings["base64"] = timings.get("base64", 0.0) + (time.perf_counter() - start) * 1e3
        out = []
        try:
            for i, raw in enumerate(raws):
                probe = self._probe(raw, f"{where}[{i}]")
                out.append(EncodedImage(raw, probe.where, probe.decoded_pixels, probe.size))
                probe.image.close()
        except BaseException:
            if sum(map(len, raws)) >= TRIM_AFTER_BYTES:
                release_free_memory()
            raise
        return out

    def decode(self, encoded: Sequence[EncodedImage], where: str) -> list[Image.Image]:
        """Decode images whose headers ``encoded`` checked (call inside `slot()`, off the
        event loop), within LAD_MAX_REQUEST_PIXELS for what is decoded at once and the
        replica's byte budget while it is: each is decoded, shrunk and its full-size pixels
        released, on the shared decode threads (in order: the answer is the same as one at
        a time)."""
        total = sum(e.pixels for e in encoded)
        if total > self.settings.max_request_pixels:
            raise errors.ImageTooLarge(
                f"{where} would decode to {total} pixels; the limit is "
                f"LAD_MAX_REQUEST_PIXELS={self.settings.max_request_pixels}"
            )
        probes: list[_Probe] = []
        held = 0
        account = ACCOUNT.get() or Account(self.budget)  # the request's, or its own
        try:
            for e in encoded:
                probes.append(self._probe(e.raw, e.where, e.size))
            # the pixels decoded at once: all of them on the threads when they fit now,
            # else one image at a time (the largest one always fits: the budget's headroom)
            threaded = len(probes) > 1 and self.settings.decode_threads > 1
            threaded = threaded and total > THREADED_PIXELS
            if threaded:
                held = account.try_grow(total * PIXEL_BYTES)
                threaded = held > 0
            if not threaded:
                largest = max((p.decoded_pixels for p in probes), default=0)
                held = account.grow(largest * PIXEL_BYTES, f"decoding {where}")
            if threaded:
                pending = [self._decode_threads().submit(self._decode_one, p) for p in probes]
                wait(pending)  # all settled before an error closes what is still open
                decoded = [future.result() for future in pending]
            else:
                decoded = [self._decode_one(probe) for probe in probes]
            probes.clear()
            return decoded
        finally:  # on an error: release everything opened so far
            account.give_back(held)
            for probe in probes:
                probe.image.close()

    def _decode_threads(self) -> ThreadPoolExecutor:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(
                self.settings.decode_threads, thread_name_prefix="lad-decode"
            )
        return self._threads

    def _decode_one(self, probe: _Probe) -> Image.Image:
        """Decode one probed image; its full-size pixels go now, not at the end."""
        image = self._decode(probe)
        if image is not probe.image:
            probe.image.close()
        probe.image = image
        return image

    def _probe(self, raw: bytes, where: str, size: tuple[int, int] | None = None) -> _Probe:
        """Open the header only: format, size and aspect ratio checked, draft scale set
        (``size``: the decode size chosen when the header was first read)."""
        check_header(raw, where)  # what reading the header may cost, before Pillow reads it
        try:
            image = Image.open(io.BytesIO(raw), formats=self.formats)
        except Image.DecompressionBombError:
            raise errors.ImageTooLarge(f"{where} is a decompression bomb") from None
        except Exception as exc:
            log.debug("%s could not be opened: %r", where, exc)
            found = sniff_format(raw)
            if found is not None and found not in self.formats:
                raise errors.UnsupportedImageFormat(
                    f"{where} is {found}; accepted formats: {', '.join(self.formats)} "
                    "(LAD_IMAGE_FORMATS)"
                ) from None
            raise errors.InvalidImage(f"{where} is not a readable image") from None
        try:
            width, height = image.size
            if width < 1 or height < 1:
                raise errors.InvalidImage(f"{where} has no pixels ({width}x{height})")
            if width * height > self.settings.max_image_pixels:
                raise errors.ImageTooLarge(
                    f"{where} is {width}x{height} pixels; the limit is "
                    f"LAD_MAX_IMAGE_PIXELS={self.settings.max_image_pixels}"
                )
            ratio = max(width, height) / min(width, height)
            if ratio > self.settings.max_aspect_ratio:
                raise errors.UnsupportedImage(
                    f"{where} is {width}x{height} pixels, an aspect ratio of {ratio:.0f}:1; the "
                    f"limit is LAD_MAX_ASPECT_RATIO={self.settings.max_aspect_ratio:g}"
                )
            size = self._size(width, height) if size is None else size
            if image.format == "JPEG" and size != (width, height):
                image.draft("RGB", size)  # decode at 1/2, 1/4 or 1/8 scale, still >= size
        except errors.ServiceError:
            image.close()
            raise
        except Exception as exc:  # a header that opens but cannot be scaled
            image.close()
            log.debug("%s has an unusable header: %r", where, exc)
            raise errors.InvalidImage(f"{where} is not a readable image") from None
        return _Probe(image, where, size)

    def _size(self, width: int, height: int) -> tuple[int, int]:
        """Where to resize to: the processor's exact input size when the model names it, it
        is a reduction and the processor keeps it as it is (one resample; a processor pinned
        to min = max pixels may not have such a size for a non-square image), else the
        largest size within the pixel budget."""
        exact = self.image_size(width, height) if self.image_size is not None else None
        if (
            exact is not None
            and exact[0] <= width
            and exact[1] <= height
            and self.image_size(*exact) == exact
        ):
            return exact
        return target_size(width, height, self.pixel_budget)

    def _decode(self, probe: _Probe) -> Image.Image:
        """Decode once, resize once (straight to the budget), orient, convert to RGB."""
        try:
            image = probe.image
            image.load()
            orientation = image.getexif().get(_ORIENTATION, 1)
            image = _to_8bit(image)
            if image.size != probe.size:
                image = image.resize(probe.size, Image.Resampling.BICUBIC, reducing_gap=3.0)
            if orientation in _TRANSPOSE:
                image = image.transpose(_TRANSPOSE[orientation])
            return _to_rgb(image)
        except errors.ServiceError:
            raise
        except Image.DecompressionBombError:
            raise errors.ImageTooLarge(f"{probe.where} is a decompression bomb") from None
        except Exception as exc:  # any decoder failure on untrusted bytes is a bad image
            log.debug("%s could not be decoded: %r", probe.where, exc)
            raise errors.InvalidImage(f"{probe.where} is truncated or corrupt") from None

    # ------------------------------------------------------------------ text
    def query(self, text: str, where: str = "query") -> str:
        """A query the model reads as plain text, within LAD_MAX_QUERY_CHARS."""
        if not text.strip():
            raise errors.InvalidQuery(f"{where} is empty")
        if len(text) > self.settings.max_query_chars:
            raise errors.InvalidQuery(
                f"{where} has {len(text)} characters; LAD_MAX_QUERY_CHARS="
                f"{self.settings.max_query_chars}"
            )
        self._plain_text(text, where, errors.InvalidQuery)
        return text

    def _plain_text(self, text: str, where: str, error: type[errors.ServiceError]) -> None:
        """No control characters, no unpaired surrogates, none of the model's special tokens
        (the processor would read "<|image_pad|>" as an image slot, not as words)."""
        if _CONTROL.search(text):
            raise error(f"{where} holds a control character")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise error(f"{where} holds an unpaired UTF-16 surrogate") from None
        if self._special is not None:
            found = self._special.search(text)
            if found:
                raise error(
                    f"{where} holds the model's special token {found.group(0)!r}; special "
                    "tokens are not allowed in user text"
                )

    def labels(self, n: int, labels: str | Sequence[str], where: str = "images") -> Labels:
        """N within limits and labels that can name N images, resolved (the one place a
        request's labels are resolved), within the label limits."""
        if n < 2:
            raise errors.TooFewImages(
                f"{where} has {n} image(s); retrieval needs N >= 2 candidates"
            )
        if n > self.settings.max_images:
            raise errors.TooManyImages(
                f"{where} has {n} images; the limit is LAD_MAX_IMAGES={self.settings.max_images}"
            )
        try:
            resolved = Labels.resolve(labels, n)
        except ValueError as exc:
            raise errors.InvalidLabels(str(exc)) from None
        limit = self.settings.max_label_chars
        for j, label in enumerate(resolved.strings):
            if len(label) > limit:
                raise errors.InvalidLabels(
                    f"label {j} has {len(label)} characters; LAD_MAX_LABEL_CHARS={limit}"
                )
            self._plain_text(label, f"label {j}", errors.InvalidLabels)
            found = _LABEL_CONTROL.search(label)
            if found:
                raise errors.InvalidLabels(
                    f"label {j} holds the control character U+{ord(found.group(0)):04X}; "
                    "labels are one line of visible text (no tabs, line breaks or bidi controls)"
                )
        return resolved

    def check_label_tokens(self, token_counts: Sequence[int]) -> None:
        """The labels' total token count (as the model tokenises them) within the limit."""
        total = sum(token_counts)
        if total > self.settings.max_label_tokens:
            raise errors.InvalidLabels(
                f"the labels tokenise to {total} tokens in all; LAD_MAX_LABEL_TOKENS="
                f"{self.settings.max_label_tokens}"
            )
