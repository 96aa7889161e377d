"""Hostile and clumsy input, one request each: never a 5xx, an error is always the envelope
with a request id, and the service is healthy afterwards (ready, and a good request works).

Odd but valid images (16-bit, CMYK, palette + alpha, animated, EXIF-rotated) must be
answered 200. The HTTP-level cases (chunked, slow and oversize bodies on a real
connection) are in test_http_edge.py.
"""

from __future__ import annotations

import base64
import io
import json
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from PIL import Image

from app.testing import hostile
from tests.api.helpers import retrieve_body

ADMIN = "admin-secret"


def _enc(image: Image.Image, fmt: str = "PNG", **save: Any) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **save)
    return base64.b64encode(buffer.getvalue()).decode()


def _b(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


RED = Image.new("RGB", (32, 32), "red")
GOOD = _enc(RED)
PNG_RAW = base64.b64decode(_enc(Image.effect_noise((48, 48), 60).convert("RGB")))


def _frames(fmt: str) -> str:
    frames = [Image.new("RGB", (24, 24), c) for c in ("red", "green", "blue")]
    return _enc(frames[0], fmt, save_all=True, append_images=frames[1:], duration=40, loop=0)


def _rotated() -> str:
    exif = Image.Exif()
    exif[0x0112] = 6
    return _enc(RED, "JPEG", exif=exif)


def _palette_alpha() -> str:
    image = Image.new("P", (24, 24), 0)
    image.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    image.paste(1, (0, 0, 12, 24))
    return _enc(image, transparency=0)


def _huge_gif_screen() -> bytes:
    """A 16x16 GIF whose logical screen claims 30000 x 30000 pixels."""
    raw = bytearray(base64.b64decode(_enc(RED, "GIF")))
    raw[6:10] = (30000).to_bytes(2, "little") * 2
    return bytes(raw)


@dataclass
class Case:
    """One hostile request: `send(client, body)` -> response; the status and code expected."""

    status: int
    code: str | None
    send: Callable[[Any, dict[str, Any]], Any]
    settings: dict[str, Any] = field(default_factory=dict)


def _retrieve(**changes: Any) -> Callable[[Any, dict[str, Any]], Any]:
    def send(client: Any, body: dict[str, Any]) -> Any:
        payload = {**body, **changes}
        return client.post(
            "/v1/retrieve", json={k: v for k, v in payload.items() if v is not _DROP}
        )

    return send


def _images(*images: str) -> Callable[[Any, dict[str, Any]], Any]:
    return _retrieve(images=list(images))


def _raw(
    content: bytes,
    media: str | None = "application/json",
    path: str = "/v1/retrieve",
    **headers: str,
) -> Callable[[Any, dict[str, Any]], Any]:
    def send(client: Any, body: dict[str, Any]) -> Any:
        all_headers = {**({"content-type": media} if media else {}), **headers}
        return client.post(path, content=content, headers=all_headers)

    return send


def _calibrate(change: Callable[[dict[str, Any]], None]) -> Callable[[Any, dict[str, Any]], Any]:
    def send(client: Any, body: dict[str, Any]) -> Any:
        examples = [
            {"query": "a red square", "images": [GOOD] * 3, "answer": i % 3} for i in range(3)
        ]
        payload = {"examples": examples}
        change(payload)
        return client.post("/v1/calibrate", json=payload)

    return send


def _get(method: str, path: str, **kwargs: Any) -> Callable[[Any, dict[str, Any]], Any]:
    return lambda client, body: client.request(method, path, **kwargs)


def _form(
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


def _multipart(boundary: bytes, **form: Any) -> Callable[[Any, dict[str, Any]], Any]:
    images = [base64.b64decode(GOOD)] * 3
    media = f"multipart/form-data; boundary={boundary.decode()}"
    return _raw(hostile.multipart_form(boundary, images, **form), media)


_DROP = object()
BOMB = _enc(Image.new("1", (20000, 20000)))
DEEP_16 = _enc(Image.fromarray(np.full((24, 24), 50000, dtype=np.uint16)))
CMYK = _enc(Image.new("CMYK", (24, 24), (0, 255, 255, 0)), "JPEG")
SVG = _b(b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>')
PDF = _b(b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << >>\n%%EOF")
EPS = _b(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n0 0 moveto showpage\n")
TIFF = _enc(RED, "TIFF")
ICO = _enc(RED, "ICO")

CASES: dict[str, Case] = {
    # ---- image bytes
    "truncated-png": Case(400, "invalid_image", _images(GOOD, _b(PNG_RAW[: len(PNG_RAW) // 2]))),
    "zero-byte-image": Case(400, "invalid_image", _images(GOOD, "")),
    "whitespace-image": Case(400, "invalid_image", _images(GOOD, "   \n ")),
    "non-image-bytes": Case(400, "invalid_image", _images(GOOD, _b(b"plain text, no pixels"))),
    "random-bytes": Case(400, "invalid_image", _images(GOOD, _b(bytes(range(256)) * 8))),
    "svg": Case(415, "unsupported_image_format", _images(GOOD, SVG)),
    "pdf": Case(415, "unsupported_image_format", _images(GOOD, PDF)),
    "eps-never-reaches-ghostscript": Case(415, "unsupported_image_format", _images(GOOD, EPS)),
    "tiff-not-in-allowlist": Case(415, "unsupported_image_format", _images(GOOD, TIFF)),
    "ico": Case(415, "unsupported_image_format", _images(GOOD, ICO)),
    "decompression-bomb-png": Case(413, "image_too_large", _images(GOOD, BOMB)),
    "bomb-gif-screen": Case(413, "image_too_large", _images(GOOD, _b(_huge_gif_screen()))),
    "pixel-budget": Case(
        413,
        "image_too_large",
        _images(*[_enc(Image.new("RGB", (200, 200)))] * 2),
        settings={"max_request_pixels": 50_000},
    ),
    "image-bytes-limit": Case(
        413, "image_too_large", _images(GOOD, _b(PNG_RAW)), settings={"max_image_bytes": 1000}
    ),
    "aspect-1x4000": Case(422, "unsupported_image", _images(GOOD, _enc(Image.new("L", (1, 4000))))),
    "aspect-4000x1": Case(422, "unsupported_image", _images(GOOD, _enc(Image.new("L", (4000, 1))))),
    "sixteen-bit-png": Case(200, None, _images(GOOD, DEEP_16)),
    "cmyk-jpeg": Case(200, None, _images(GOOD, CMYK)),
    "palette-alpha-png": Case(200, None, _images(GOOD, _palette_alpha())),
    "animated-gif": Case(200, None, _images(GOOD, _frames("GIF"))),
    "animated-webp": Case(200, None, _images(GOOD, _frames("WEBP"))),
    "exif-rotated-jpeg": Case(200, None, _images(GOOD, _rotated())),
    "jpeg-200k-empty-app15": Case(
        422, "unsupported_image", _images(GOOD, _b(hostile.jpeg_with_app_segments(200_000)))
    ),
    "jpeg-1025-empty-app1": Case(
        422, "unsupported_image", _images(GOOD, _b(hostile.jpeg_with_app_segments(1025, 0xE1)))
    ),
    "jpeg-1000-app-segments-is-200": Case(
        200, None, _images(GOOD, _b(hostile.jpeg_with_app_segments(1000)))
    ),
    "jpeg-fill-bytes": Case(
        422,
        "unsupported_image",
        _images(
            GOOD,
            _b(
                hostile.small_image("JPEG")[:2]
                + b"\xff" * 100_000
                + hostile.small_image("JPEG")[2:]
            ),
        ),
    ),
    "jpeg-300-scans": Case(
        422,
        "unsupported_image",
        _images(GOOD, _b(hostile.small_image("JPEG") + b"\xff\xda\x00\x02" * 300)),
    ),
    "png-100k-empty-chunks": Case(
        422, "unsupported_image", _images(GOOD, _b(hostile.png_with_chunks(b"prVt", b"", 100_000)))
    ),
    "png-600-text-chunks": Case(
        422,
        "unsupported_image",
        _images(GOOD, _b(hostile.png_with_chunks(b"tEXt", b"k\x00v", 600))),
    ),
    "png-text-over-4-mib": Case(
        400,
        "invalid_image",
        _images(
            GOOD,
            _b(hostile.png_with_chunks(b"zTXt", b"k\x00\x00" + zlib.compress(b"v" * 1_000_000), 5)),
        ),
    ),
    "png-exif-70k": Case(
        422,
        "unsupported_image",
        _images(GOOD, _b(hostile.png_with_exif(hostile.exif_with_broken_tags(6000)))),
    ),
    "gif-100k-comment-blocks": Case(
        422, "unsupported_image", _images(GOOD, _b(hostile.gif_with_comment_blocks(100_000)))
    ),
    "webp-exif-70k": Case(
        422,
        "unsupported_image",
        _images(GOOD, _b(hostile.webp_with_exif(hostile.exif_with_broken_tags(6000)))),
    ),
    "one-pixel": Case(200, None, _images(GOOD, _enc(Image.new("RGB", (1, 1))))),
    # ---- base64 and data URLs
    "invalid-base64": Case(400, "invalid_image", _images(GOOD, "@@@ not base64 @@@")),
    "base64-bad-padding": Case(400, "invalid_image", _images(GOOD, GOOD[:-2])),
    "data-url-text-plain": Case(
        400, "invalid_image", _images(GOOD, "data:text/plain;base64," + GOOD)
    ),
    "data-url-no-base64": Case(400, "invalid_image", _images(GOOD, "data:image/png," + GOOD)),
    "data-url-no-comma": Case(400, "invalid_image", _images(GOOD, "data:image/png;base64")),
    "non-ascii-base64": Case(400, "invalid_image", _images(GOOD, "ÿÿÿÿ" * 8)),
    # ---- JSON shape
    "malformed-json": Case(422, "invalid_request", _raw(b'{"query": "x", "images": [')),
    "json-array-body": Case(422, "invalid_request", _raw(b'["a", "b"]')),
    "json-nan": Case(
        422, "invalid_request", _raw(b'{"query": "x", "images": ["a", "b"], "return_details": NaN}')
    ),
    "json-infinity": Case(
        422, "invalid_request", _raw(b'{"query": "x", "images": ["a", "b"], "profile": Infinity}')
    ),
    "json-deep-nesting": Case(422, "invalid_request", _raw(b"[" * 20000 + b"]" * 20000)),
    "json-200k-unknown-keys": Case(
        422, "invalid_request", _raw(hostile.json_unknown_keys(200_000))
    ),
    "json-nesting-34": Case(
        422,
        "invalid_request",
        _raw(b'{"query": "x", "images": ["a", "b"], "labels": ' + b"[" * 32 + b"]" * 32 + b"}"),
    ),
    "json-300k-numbers": Case(
        422,
        "invalid_request",
        _raw(b'{"query": "x", "images": [' + b",".join([b"1"] * 150_000) + b"]}"),
    ),
    "json-unterminated-string": Case(422, "invalid_request", _raw(b'{"query": "' + b"x" * 10**6)),
    "empty-body": Case(422, "invalid_request", _raw(b"")),
    "missing-query": Case(422, "invalid_request", _retrieve(query=_DROP)),
    "missing-images": Case(422, "invalid_request", _retrieve(images=_DROP)),
    "query-wrong-type": Case(422, "invalid_request", _retrieve(query=42)),
    "images-wrong-type": Case(422, "invalid_request", _retrieve(images="abc")),
    "image-wrong-type": Case(422, "invalid_request", _retrieve(images=[GOOD, 7])),
    "image-null": Case(422, "invalid_request", _retrieve(images=[GOOD, None])),
    "images-nested": Case(422, "invalid_request", _retrieve(images=[[GOOD], [GOOD]])),
    "method-wrong-type": Case(422, "invalid_request", _retrieve(method=["agd"])),
    "details-wrong-type": Case(422, "invalid_request", _retrieve(return_details=[1])),
    "unknown-field": Case(422, "invalid_request", _retrieve(surprise=True)),
    # ---- counts
    "zero-images": Case(422, "invalid_request", _images()),
    "one-image": Case(422, "invalid_request", _images(GOOD)),
    "thirteen-images": Case(422, "too_many_images", _images(*[GOOD] * 13)),
    "sixty-five-images": Case(422, "invalid_request", _images(*[GOOD] * 65)),
    # ---- query text
    "empty-query": Case(422, "invalid_request", _retrieve(query="")),
    "blank-query": Case(422, "invalid_query", _retrieve(query=" \t ")),
    "100k-query": Case(422, "invalid_query", _retrieve(query="x" * 100_000)),
    "over-100k-query": Case(422, "invalid_request", _retrieve(query="x" * 100_001)),
    "nul-in-query": Case(422, "invalid_query", _retrieve(query="a\x00b")),
    "escape-in-query": Case(422, "invalid_query", _retrieve(query="a\x1b[31mred")),
    "image-pad-token-in-query": Case(422, "invalid_query", _retrieve(query="a <|image_pad|>")),
    "vision-start-token-in-query": Case(
        422, "invalid_query", _retrieve(query="<|vision_start|> x <|vision_end|>")
    ),
    "im-end-token-in-query": Case(422, "invalid_query", _retrieve(query="x<|im_end|>")),
    "lone-surrogate-query": Case(
        422,
        None,
        _raw(
            b'{"query": "a\\ud800b", "images": ["'
            + GOOD.encode()
            + b'", "'
            + GOOD.encode()
            + b'"], "method": "vanilla"}'
        ),
    ),
    # ---- method and labels
    "unknown-method": Case(422, "invalid_request", _retrieve(method="magic")),
    "unknown-label-scheme": Case(422, "invalid_labels", _retrieve(labels="klingon")),
    "labels-wrong-count": Case(422, "invalid_labels", _retrieve(labels=["a", "b"])),
    "labels-duplicate": Case(422, "invalid_labels", _retrieve(labels=["a", "a", "b"])),
    "label-16k-chars": Case(422, "invalid_labels", _retrieve(labels=["a" * 16900, "b", "c"])),
    "labels-too-many-tokens": Case(
        422,
        "invalid_labels",
        _retrieve(images=[GOOD] * 12, labels=[f"{i}" + "y" * 1000 for i in range(12)]),
        settings={"max_label_chars": 10_000},
    ),
    "label-special-token": Case(
        422, "invalid_labels", _retrieve(labels=["<|image_pad|>", "b", "c"])
    ),
    "label-blank": Case(422, "invalid_labels", _retrieve(labels=["a", " ", "c"])),
    "labels-not-strings": Case(422, "invalid_request", _retrieve(labels=[1, 2, 3])),
    "n-larger-than-scheme": Case(
        422,
        "invalid_labels",
        _retrieve(images=[GOOD] * 27, labels="upper"),
        settings={"max_images": 30},
    ),
    "profile-path-traversal": Case(422, "invalid_request", _retrieve(profile="../etc/passwd")),
    "profile-too-long": Case(422, "invalid_request", _retrieve(profile="p" * 500)),
    "uncalibrated-agd": Case(409, "calibration_required", _retrieve(method="agd")),
    # ---- calibrate
    "calibrate-mixed-n": Case(
        422,
        "invalid_calibration",
        _calibrate(lambda p: p["examples"][0].update(images=[GOOD] * 2, answer=0)),
    ),
    "calibrate-answer-out-of-range": Case(
        422, "invalid_calibration", _calibrate(lambda p: p["examples"][0].update(answer=5))
    ),
    "calibrate-negative-answer": Case(
        422, "invalid_request", _calibrate(lambda p: p["examples"][0].update(answer=-1))
    ),
    "calibrate-fractional-answer": Case(
        422, "invalid_request", _calibrate(lambda p: p["examples"][0].update(answer=1.5))
    ),
    "calibrate-no-examples": Case(
        422, "invalid_request", _calibrate(lambda p: p.update(examples=[]))
    ),
    "calibrate-65-examples": Case(
        422, "invalid_request", _calibrate(lambda p: p.update(examples=p["examples"] * 22))
    ),
    "calibrate-bad-image": Case(
        400, "invalid_image", _calibrate(lambda p: p["examples"][1]["images"].__setitem__(0, "@@"))
    ),
    "calibrate-special-token": Case(
        422, "invalid_query", _calibrate(lambda p: p["examples"][1].update(query="<|image_pad|>"))
    ),
    "calibrate-text-plain": Case(
        415, "unsupported_media_type", _raw(b"{}", "text/plain", "/v1/calibrate")
    ),
    "calibrate-wrong-token": Case(
        403,
        "forbidden",
        _raw(b"{}", path="/v1/calibrate", authorization="Bearer nope"),
        {"admin_token": ADMIN},
    ),
    "calibrate-no-token": Case(
        401, "unauthorized", _raw(b"{", path="/v1/calibrate"), {"admin_token": ADMIN}
    ),
    # ---- content types and forms
    "text-plain": Case(415, "unsupported_media_type", _raw(b"query=x", "text/plain")),
    "no-content-type": Case(415, "unsupported_media_type", _raw(b"{}", None)),
    "multipart-no-boundary": Case(400, "bad_request", _form({}, media="multipart/form-data")),
    "multipart-garbage": Case(400, None, _form({}, media="multipart/form-data; boundary=x")),
    "multipart-unknown-field": Case(422, "invalid_request", _form({"query": "x", "colour": "red"})),
    "multipart-no-query": Case(422, "invalid_request", _form({"method": "vanilla"})),
    "multipart-repeated-query": Case(422, "invalid_request", _form({"query": ["a", "b"]})),
    "multipart-too-many-files": Case(
        422,
        "too_many_images",
        _form({"query": "x"}, [("images", (f"{i}.png", b"x", "image/png")) for i in range(13)]),
    ),
    "multipart-bad-labels": Case(422, "invalid_labels", _form({"query": "x", "labels": "[1,"})),
    "multipart-closed-form-is-200": Case(200, None, _multipart(b"x" * 70)),
    "multipart-boundary-300": Case(400, "bad_request", _multipart(b"x" * 300)),
    "multipart-no-closing-boundary": Case(400, "bad_request", _multipart(b"bnd", close=False)),
    "multipart-cut-last-file": Case(400, "bad_request", _multipart(b"bnd", close=False, cut=60)),
    "declared-body-too-large": Case(
        413, "payload_too_large", _raw(b" " * 100_000), settings={"max_body_bytes": 60_000}
    ),
    # ---- profile routes, routing, headers
    "profile-n-huge": Case(
        422, "invalid_request", _get("DELETE", "/v1/profiles/default", params={"n": 10**30})
    ),
    "profile-n-4097": Case(
        422, "invalid_request", _get("DELETE", "/v1/profiles/default", params={"n": 4097})
    ),
    "profile-n-zero": Case(
        422, "invalid_request", _get("POST", "/v1/profiles/default/rollback", params={"n": 0})
    ),
    "profile-n-text": Case(
        422, "invalid_request", _get("DELETE", "/v1/profiles/default", params={"n": "many"})
    ),
    "profile-labels-3000": Case(
        422,
        "invalid_request",
        _get("DELETE", "/v1/profiles/default", params={"n": 3, "labels": "custom:" + "a" * 3000}),
    ),
    "profile-labels-bad-json": Case(
        422,
        "invalid_labels",
        _get("POST", "/v1/profiles/default/rollback", params={"n": 3, "labels": "[1, 2]"}),
    ),
    "profile-version-negative": Case(
        422,
        "invalid_request",
        _get("POST", "/v1/profiles/default/rollback", params={"n": 3, "version": -1}),
    ),
    "profile-version-huge": Case(
        422,
        "invalid_request",
        _get("POST", "/v1/profiles/default/rollback", params={"n": 3, "version": 10**20}),
    ),
    "profile-unknown-delete": Case(
        404, "profile_not_found", _get("DELETE", "/v1/profiles/nobody", params={"n": 3})
    ),
    "profile-unknown-get": Case(404, "profile_not_found", _get("GET", "/v1/profiles/nobody")),
    "profile-bad-name": Case(422, "invalid_request", _get("GET", "/v1/profiles/-bad")),
    "unknown-route": Case(404, "not_found", _get("GET", "/v1/../../etc/passwd")),
    "method-not-allowed": Case(405, "method_not_allowed", _get("PATCH", "/v1/profiles/default")),
    "insane-request-id": Case(
        404,
        "not_found",
        _get("GET", "/nope", headers={"X-Request-ID": "bad id\twith spaces" + "x" * 300}),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_input(make_client, items, name: str) -> None:
    case = CASES[name]
    client = make_client(raise_server_exceptions=False, **case.settings)
    body = retrieve_body(items[0], method="vanilla")
    response = case.send(client, body)
    assert response.status_code == case.status, response.text[:500]
    assert "x-request-id" in response.headers
    if case.status >= 400:
        error = response.json()["error"]
        assert set(error) == {"code", "message", "request_id"}
        assert case.code is None or error["code"] == case.code, error
        assert error["request_id"] == response.headers["x-request-id"]
        assert not re.search(r"0x[0-9a-f]{6}|Traceback|BytesIO", error["message"]), error
    if name == "insane-request-id":
        assert response.headers["x-request-id"] != "bad id"
        assert len(response.headers["x-request-id"]) <= 128
    if case.status == 405:
        assert response.headers["allow"] == "DELETE, GET, HEAD"
    # healthy after: ready, and a good request on the same app still answers
    assert client.get("/readyz").status_code == 200
    good = client.post("/v1/retrieve", json=body, headers={"authorization": f"Bearer {ADMIN}"})
    assert good.status_code == 200, good.text[:300]


def test_the_suite_is_large_enough() -> None:
    assert len(CASES) >= 60


def test_json_body_round_trip_of_the_cases_is_valid() -> None:
    """The cases that send JSON send what they say (guards the table against typos)."""
    assert json.loads(json.dumps({"images": [GOOD, DEEP_16, CMYK]}))
