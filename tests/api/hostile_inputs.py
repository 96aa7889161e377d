"""The inputs of the hostile-input cases (test_hostile.py): images that are odd, broken
or hostile, and the request builders each case sends."""

from __future__ import annotations

import base64
import io
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

from lad_lab.testing import hostile

ADMIN = "admin-secret"


def enc(image: Image.Image, fmt: str = "PNG", **save: Any) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **save)
    return base64.b64encode(buffer.getvalue()).decode()


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


RED = Image.new("RGB", (32, 32), "red")
GOOD = enc(RED)
PNG_RAW = base64.b64decode(enc(Image.effect_noise((48, 48), 60).convert("RGB")))


def frames(fmt: str) -> str:
    frames = [Image.new("RGB", (24, 24), c) for c in ("red", "green", "blue")]
    return enc(frames[0], fmt, save_all=True, append_images=frames[1:], duration=40, loop=0)


def rotated() -> str:
    exif = Image.Exif()
    exif[0x0112] = 6
    return enc(RED, "JPEG", exif=exif)


def palette_alpha() -> str:
    image = Image.new("P", (24, 24), 0)
    image.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    image.paste(1, (0, 0, 12, 24))
    return enc(image, transparency=0)


def huge_gif_screen() -> bytes:
    """A 16x16 GIF whose logical screen claims 30000 x 30000 pixels."""
    raw = bytearray(base64.b64decode(enc(RED, "GIF")))
    raw[6:10] = (30000).to_bytes(2, "little") * 2
    return bytes(raw)


@dataclass
class Case:
    """One hostile request: `send(client, body)` -> response; the status and code expected."""

    status: int
    code: str | None
    send: Callable[[Any, dict[str, Any]], Any]
    settings: dict[str, Any] = field(default_factory=dict)


def retrieve(**changes: Any) -> Callable[[Any, dict[str, Any]], Any]:
    def send(client: Any, body: dict[str, Any]) -> Any:
        payload = {**body, **changes}
        return client.post("/v1/retrieve", json={k: v for k, v in payload.items() if v is not DROP})

    return send


def images(*images: str) -> Callable[[Any, dict[str, Any]], Any]:
    return retrieve(images=list(images))


def raw_body(
    content: bytes,
    media: str | None = "application/json",
    path: str = "/v1/retrieve",
    **headers: str,
) -> Callable[[Any, dict[str, Any]], Any]:
    def send(client: Any, body: dict[str, Any]) -> Any:
        all_headers = {**({"content-type": media} if media else {}), **headers}
        return client.post(path, content=content, headers=all_headers)

    return send


def calibrate(change: Callable[[dict[str, Any]], None]) -> Callable[[Any, dict[str, Any]], Any]:
    def send(client: Any, body: dict[str, Any]) -> Any:
        examples = [
            {"query": "a red square", "images": [GOOD] * 3, "answer": i % 3} for i in range(3)
        ]
        payload = {"examples": examples}
        change(payload)
        return client.post("/v1/calibrate", json=payload)

    return send


def get(method: str, path: str, **kwargs: Any) -> Callable[[Any, dict[str, Any]], Any]:
    return lambda client, body: client.request(method, path, **kwargs)


def form(
    data: dict[str, Any], files: list[Any] | None = None, media: str | None = None
) -> Callable[[Any, dict[str, Any]], Any]:
    def send(client: Any, body: dict[str, Any]) -> Any:
        if media is not None:
            return client.post(
                "/v1/retrieve", content=b"--x\r\nnot a form", headers={"content-type": media}
            )
        parts = (
            files
            if files is not None
            else [("images", (f"{i}.png", base64.b64decode(GOOD), "image/png")) for i in range(3)]
        )
        return client.post("/v1/retrieve", data=data, files=parts)

    return send


def multipart(boundary: bytes, **form: Any) -> Callable[[Any, dict[str, Any]], Any]:
    images = [base64.b64decode(GOOD)] * 3
    media = f"multipart/form-data; boundary={boundary.decode()}"
    return raw_body(hostile.multipart_form(boundary, images, **form), media)


DROP = object()
BOMB = enc(Image.new("1", (20000, 20000)))
DEEP_16 = enc(Image.fromarray(np.full((24, 24), 50000, dtype=np.uint16)))
CMYK = enc(Image.new("CMYK", (24, 24), (0, 255, 255, 0)), "JPEG")
SVG = b64(b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>')
PDF = b64(b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << >>\n%%EOF")
EPS = b64(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n0 0 moveto showpage\n")
TIFF = enc(RED, "TIFF")
ICO = enc(RED, "ICO")
