"""Hostile and clumsy input, one request each: never a 5xx, an error is always the envelope
with a request id, and the service is healthy afterwards (ready, and a good request works).

Odd but valid images (16-bit, CMYK, palette + alpha, animated, EXIF-rotated) must be
answered 200. The HTTP-level cases (chunked, slow and oversize bodies on a real
connection) are in test_http_edge.py.
"""

from __future__ import annotations

import json
import re
import zlib

import pytest
from PIL import Image

from lad_lab.testing import hostile
from tests.api.helpers import retrieve_body
from tests.api.hostile_inputs import (
    ADMIN,
    BOMB,
    CMYK,
    DEEP_16,
    DROP,
    EPS,
    GOOD,
    ICO,
    PDF,
    PNG_RAW,
    RED,
    SVG,
    TIFF,
    Case,
    b64,
    calibrate,
    enc,
    form,
    frames,
    get,
    huge_gif_screen,
    images,
    multipart,
    palette_alpha,
    raw_body,
    retrieve,
    rotated,
)

CASES: dict[str, Case] = {
    # ---- image bytes
    "truncated-png": Case(400, "invalid_image", images(GOOD, b64(PNG_RAW[: len(PNG_RAW) // 2]))),
    "zero-byte-image": Case(400, "invalid_image", images(GOOD, "")),
    "whitespace-image": Case(400, "invalid_image", images(GOOD, "   \n ")),
    "non-image-bytes": Case(400, "invalid_image", images(GOOD, b64(b"plain text, no pixels"))),
    # descending bytes: 00 01 02 ... happens to be a colour-mapped TGA header, which Pillow
    # 10.0 (the lowest version) opens and names (415), and newer releases refuse as junk (400)
    "random-bytes": Case(400, "invalid_image", images(GOOD, b64(bytes(range(255, -1, -1)) * 8))),
    "svg": Case(415, "unsupported_image_format", images(GOOD, SVG)),
    "pdf": Case(415, "unsupported_image_format", images(GOOD, PDF)),
    "eps-never-reaches-ghostscript": Case(415, "unsupported_image_format", images(GOOD, EPS)),
    "tiff-not-in-allowlist": Case(415, "unsupported_image_format", images(GOOD, TIFF)),
    "ico": Case(415, "unsupported_image_format", images(GOOD, ICO)),
    "ppm": Case(415, "unsupported_image_format", images(GOOD, enc(RED, "PPM"))),
    "pcx": Case(415, "unsupported_image_format", images(GOOD, enc(RED, "PCX"))),
    "tga": Case(415, "unsupported_image_format", images(GOOD, enc(RED, "TGA"))),
    "decompression-bomb-png": Case(413, "image_too_large", images(GOOD, BOMB)),
    "bomb-gif-screen": Case(413, "image_too_large", images(GOOD, b64(huge_gif_screen()))),
    "pixel-budget": Case(
        413,
        "image_too_large",
        images(*[enc(Image.new("RGB", (200, 200)))] * 2),
        settings={"max_request_pixels": 50_000},
    ),
    "image-bytes-limit": Case(
        413, "image_too_large", images(GOOD, b64(PNG_RAW)), settings={"max_image_bytes": 1000}
    ),
    "aspect-1x4000": Case(422, "unsupported_image", images(GOOD, enc(Image.new("L", (1, 4000))))),
    "aspect-4000x1": Case(422, "unsupported_image", images(GOOD, enc(Image.new("L", (4000, 1))))),
    "sixteen-bit-png": Case(200, None, images(GOOD, DEEP_16)),
    "cmyk-jpeg": Case(200, None, images(GOOD, CMYK)),
    "palette-alpha-png": Case(200, None, images(GOOD, palette_alpha())),
    "animated-gif": Case(200, None, images(GOOD, frames("GIF"))),
    "animated-webp": Case(200, None, images(GOOD, frames("WEBP"))),
    "exif-rotated-jpeg": Case(200, None, images(GOOD, rotated())),
    "jpeg-200k-empty-app15": Case(
        422, "unsupported_image", images(GOOD, b64(hostile.jpeg_with_app_segments(200_000)))
    ),
    "jpeg-1025-empty-app1": Case(
        422, "unsupported_image", images(GOOD, b64(hostile.jpeg_with_app_segments(1025, 0xE1)))
    ),
    "jpeg-1000-app-segments-is-200": Case(
        200, None, images(GOOD, b64(hostile.jpeg_with_app_segments(1000)))
    ),
    "jpeg-fill-bytes": Case(
        422,
        "unsupported_image",
        images(
            GOOD,
            b64(
                hostile.small_image("JPEG")[:2]
                + b"\xff" * 100_000
                + hostile.small_image("JPEG")[2:]
            ),
        ),
    ),
    "jpeg-300-scans": Case(
        422,
        "unsupported_image",
        images(GOOD, b64(hostile.small_image("JPEG") + b"\xff\xda\x00\x02" * 300)),
    ),
    "jpeg-progressive-230-scans-of-1100px": Case(
        422,
        "unsupported_image",
        images(GOOD, b64(hostile.progressive_jpeg_with_scans(1100, 230))),
    ),
    "png-two-icc-profiles": Case(
        422, "unsupported_image", images(GOOD, b64(hostile.png_with_icc_profiles(2)))
    ),
    "png-one-icc-profile-is-200": Case(
        200, None, images(GOOD, b64(hostile.png_with_icc_profiles(1, 1000)))
    ),
    "png-100k-empty-chunks": Case(
        422, "unsupported_image", images(GOOD, b64(hostile.png_with_chunks(b"prVt", b"", 100_000)))
    ),
    "png-600-text-chunks": Case(
        422,
        "unsupported_image",
        images(GOOD, b64(hostile.png_with_chunks(b"tEXt", b"k\x00v", 600))),
    ),
    "png-text-over-4-mib": Case(
        400,
        "invalid_image",
        images(
            GOOD,
            b64(
                hostile.png_with_chunks(b"zTXt", b"k\x00\x00" + zlib.compress(b"v" * 1_000_000), 5)
            ),
        ),
    ),
    "png-exif-70k": Case(
        422,
        "unsupported_image",
        images(GOOD, b64(hostile.png_with_exif(hostile.exif_with_broken_tags(6000)))),
    ),
    "gif-100k-comment-blocks": Case(
        422, "unsupported_image", images(GOOD, b64(hostile.gif_with_comment_blocks(100_000)))
    ),
    "webp-exif-70k": Case(
        422,
        "unsupported_image",
        images(GOOD, b64(hostile.webp_with_exif(hostile.exif_with_broken_tags(6000)))),
    ),
    "one-pixel": Case(200, None, images(GOOD, enc(Image.new("RGB", (1, 1))))),
    # ---- base64 and data URLs
    "invalid-base64": Case(400, "invalid_image", images(GOOD, "@@@ not base64 @@@")),
    "base64-bad-padding": Case(400, "invalid_image", images(GOOD, GOOD[:-2])),
    "data-url-text-plain": Case(
        400, "invalid_image", images(GOOD, "data:text/plain;base64," + GOOD)
    ),
    "data-url-no-base64": Case(400, "invalid_image", images(GOOD, "data:image/png," + GOOD)),
    "data-url-no-comma": Case(400, "invalid_image", images(GOOD, "data:image/png;base64")),
    "non-ascii-base64": Case(400, "invalid_image", images(GOOD, "ÿÿÿÿ" * 8)),
    # ---- JSON shape
    "malformed-json": Case(422, "invalid_request", raw_body(b'{"query": "x", "images": [')),
    "json-array-body": Case(422, "invalid_request", raw_body(b'["a", "b"]')),
    "json-nan": Case(
        422,
        "invalid_request",
        raw_body(b'{"query": "x", "images": ["a", "b"], "return_details": NaN}'),
    ),
    "json-infinity": Case(
        422,
        "invalid_request",
        raw_body(b'{"query": "x", "images": ["a", "b"], "profile": Infinity}'),
    ),
    "json-deep-nesting": Case(422, "invalid_request", raw_body(b"[" * 20000 + b"]" * 20000)),
    "json-200k-unknown-keys": Case(
        422, "invalid_request", raw_body(hostile.json_unknown_keys(200_000))
    ),
    "json-nesting-34": Case(
        422,
        "invalid_request",
        raw_body(b'{"query": "x", "images": ["a", "b"], "labels": ' + b"[" * 32 + b"]" * 32 + b"}"),
    ),
    "json-300k-numbers": Case(
        422,
        "invalid_request",
        raw_body(b'{"query": "x", "images": [' + b",".join([b"1"] * 150_000) + b"]}"),
    ),
    "json-duplicate-key": Case(
        422,
        "invalid_request",
        raw_body(
            b'{"query": "x", "images": ["%s", "%s"], "method": "vanilla", "method": "agd"}'
            % (GOOD.encode(), GOOD.encode())
        ),
    ),
    "json-duplicate-key-escaped": Case(
        422,
        "invalid_request",
        raw_body(
            b'{"query": "x", "images": ["%s", "%s"], "method": "vanilla", "\\u006dethod": "agd"}'
            % (GOOD.encode(), GOOD.encode())
        ),
    ),
    "json-unterminated-string": Case(
        422, "invalid_request", raw_body(b'{"query": "' + b"x" * 10**6)
    ),
    "empty-body": Case(422, "invalid_request", raw_body(b"")),
    "missing-query": Case(422, "invalid_request", retrieve(query=DROP)),
    "missing-images": Case(422, "invalid_request", retrieve(images=DROP)),
    "query-wrong-type": Case(422, "invalid_request", retrieve(query=42)),
    "images-wrong-type": Case(422, "invalid_request", retrieve(images="abc")),
    "image-wrong-type": Case(422, "invalid_request", retrieve(images=[GOOD, 7])),
    "image-null": Case(422, "invalid_request", retrieve(images=[GOOD, None])),
    "images-nested": Case(422, "invalid_request", retrieve(images=[[GOOD], [GOOD]])),
    "method-wrong-type": Case(422, "invalid_request", retrieve(method=["agd"])),
    "details-wrong-type": Case(422, "invalid_request", retrieve(return_details=[1])),
    "unknown-field": Case(422, "invalid_request", retrieve(surprise=True)),
    # ---- counts
    "zero-images": Case(422, "invalid_request", images()),
    "one-image": Case(422, "invalid_request", images(GOOD)),
    "thirteen-images": Case(422, "too_many_images", images(*[GOOD] * 13)),
    "sixty-five-images": Case(422, "invalid_request", images(*[GOOD] * 65)),
    # ---- query text
    "empty-query": Case(422, "invalid_request", retrieve(query="")),
    "blank-query": Case(422, "invalid_query", retrieve(query=" \t ")),
    "100k-query": Case(422, "invalid_query", retrieve(query="x" * 100_000)),
    "over-100k-query": Case(422, "invalid_request", retrieve(query="x" * 100_001)),
    "nul-in-query": Case(422, "invalid_query", retrieve(query="a\x00b")),
    "escape-in-query": Case(422, "invalid_query", retrieve(query="a\x1b[31mred")),
    "image-pad-token-in-query": Case(422, "invalid_query", retrieve(query="a <|image_pad|>")),
    "vision-start-token-in-query": Case(
        422, "invalid_query", retrieve(query="<|vision_start|> x <|vision_end|>")
    ),
    "im-end-token-in-query": Case(422, "invalid_query", retrieve(query="x<|im_end|>")),
    "lone-surrogate-query": Case(
        422,
        None,
        raw_body(
            b'{"query": "a\\ud800b", "images": ["'
            + GOOD.encode()
            + b'", "'
            + GOOD.encode()
            + b'"], "method": "vanilla"}'
        ),
    ),
    # ---- method and labels
    "unknown-method": Case(422, "invalid_request", retrieve(method="magic")),
    "unknown-label-scheme": Case(422, "invalid_labels", retrieve(labels="klingon")),
    "labels-wrong-count": Case(422, "invalid_labels", retrieve(labels=["a", "b"])),
    "labels-duplicate": Case(422, "invalid_labels", retrieve(labels=["a", "a", "b"])),
    "label-16k-chars": Case(422, "invalid_labels", retrieve(labels=["a" * 16900, "b", "c"])),
    "labels-too-many-tokens": Case(
        422,
        "invalid_labels",
        retrieve(images=[GOOD] * 12, labels=[f"{i}" + "y" * 1000 for i in range(12)]),
        settings={"max_label_chars": 10_000},
    ),
    "label-special-token": Case(
        422, "invalid_labels", retrieve(labels=["<|image_pad|>", "b", "c"])
    ),
    "label-newline": Case(422, "invalid_labels", retrieve(labels=["a\nb", "b", "c"])),
    "label-tab": Case(422, "invalid_labels", retrieve(labels=["a\tb", "b", "c"])),
    "label-bidi-override": Case(422, "invalid_labels", retrieve(labels=["\u202eabc", "b", "c"])),
    "label-bidi-isolate": Case(422, "invalid_labels", retrieve(labels=["a\u2066b", "b", "c"])),
    "label-c1-control": Case(422, "invalid_labels", retrieve(labels=["a\x85b", "b", "c"])),
    "label-blank": Case(422, "invalid_labels", retrieve(labels=["a", " ", "c"])),
    "labels-not-strings": Case(422, "invalid_request", retrieve(labels=[1, 2, 3])),
    "n-larger-than-scheme": Case(
        422,
        "invalid_labels",
        retrieve(images=[GOOD] * 27, labels="upper"),
        settings={"max_images": 30},
    ),
    "profile-path-traversal": Case(422, "invalid_request", retrieve(profile="../etc/passwd")),
    "profile-too-long": Case(422, "invalid_request", retrieve(profile="p" * 500)),
    "uncalibrated-agd": Case(409, "calibration_required", retrieve(method="agd")),
    # ---- calibrate
    "calibrate-mixed-n": Case(
        422,
        "invalid_calibration",
        calibrate(lambda p: p["examples"][0].update(images=[GOOD] * 2, answer=0)),
    ),
    "calibrate-answer-out-of-range": Case(
        422, "invalid_calibration", calibrate(lambda p: p["examples"][0].update(answer=5))
    ),
    "calibrate-negative-answer": Case(
        422, "invalid_request", calibrate(lambda p: p["examples"][0].update(answer=-1))
    ),
    "calibrate-fractional-answer": Case(
        422, "invalid_request", calibrate(lambda p: p["examples"][0].update(answer=1.5))
    ),
    "calibrate-no-examples": Case(
        422, "invalid_request", calibrate(lambda p: p.update(examples=[]))
    ),
    "calibrate-65-examples": Case(
        422, "invalid_request", calibrate(lambda p: p.update(examples=p["examples"] * 22))
    ),
    "calibrate-bad-image": Case(
        400, "invalid_image", calibrate(lambda p: p["examples"][1]["images"].__setitem__(0, "@@"))
    ),
    "calibrate-special-token": Case(
        422, "invalid_query", calibrate(lambda p: p["examples"][1].update(query="<|image_pad|>"))
    ),
    "calibrate-text-plain": Case(
        415, "unsupported_media_type", raw_body(b"{}", "text/plain", "/v1/calibrate")
    ),
    "calibrate-wrong-token": Case(
        403,
        "forbidden",
        raw_body(b"{}", path="/v1/calibrate", authorization="Bearer nope"),
        {"admin_token": ADMIN},
    ),
    "calibrate-no-token": Case(
        401, "unauthorized", raw_body(b"{", path="/v1/calibrate"), {"admin_token": ADMIN}
    ),
    # ---- content types and forms
    "text-plain": Case(415, "unsupported_media_type", raw_body(b"query=x", "text/plain")),
    "no-content-type": Case(415, "unsupported_media_type", raw_body(b"{}", None)),
    "multipart-no-boundary": Case(400, "bad_request", form({}, media="multipart/form-data")),
    "multipart-garbage": Case(400, None, form({}, media="multipart/form-data; boundary=x")),
    "multipart-unknown-field": Case(422, "invalid_request", form({"query": "x", "colour": "red"})),
    "multipart-no-query": Case(422, "invalid_request", form({"method": "vanilla"})),
    "multipart-repeated-query": Case(422, "invalid_request", form({"query": ["a", "b"]})),
    "multipart-too-many-files": Case(
        422,
        "too_many_images",
        form({"query": "x"}, [("images", (f"{i}.png", b"x", "image/png")) for i in range(13)]),
    ),
    "multipart-bad-labels": Case(422, "invalid_labels", form({"query": "x", "labels": "[1,"})),
    "multipart-closed-form-is-200": Case(200, None, multipart(b"x" * 70)),
    "multipart-boundary-300": Case(400, "bad_request", multipart(b"x" * 300)),
    "multipart-no-closing-boundary": Case(400, "bad_request", multipart(b"bnd", close=False)),
    "multipart-cut-last-file": Case(400, "bad_request", multipart(b"bnd", close=False, cut=60)),
    "declared-body-too-large": Case(
        413, "payload_too_large", raw_body(b" " * 100_000), settings={"max_body_bytes": 60_000}
    ),
    # ---- profile routes, routing, headers
    "profile-n-huge": Case(
        422, "invalid_request", get("DELETE", "/v1/profiles/default", params={"n": 10**30})
    ),
    "profile-n-4097": Case(
        422, "invalid_request", get("DELETE", "/v1/profiles/default", params={"n": 4097})
    ),
    "profile-n-zero": Case(
        422, "invalid_request", get("POST", "/v1/profiles/default/rollback", params={"n": 0})
    ),
    "profile-n-text": Case(
        422, "invalid_request", get("DELETE", "/v1/profiles/default", params={"n": "many"})
    ),
    "profile-labels-3000": Case(
        422,
        "invalid_request",
        get("DELETE", "/v1/profiles/default", params={"n": 3, "labels": "custom:" + "a" * 3000}),
    ),
    "profile-labels-bad-json": Case(
        422,
        "invalid_labels",
        get("POST", "/v1/profiles/default/rollback", params={"n": 3, "labels": "[1, 2]"}),
    ),
    "profile-version-negative": Case(
        422,
        "invalid_request",
        get("POST", "/v1/profiles/default/rollback", params={"n": 3, "version": -1}),
    ),
    "profile-version-huge": Case(
        422,
        "invalid_request",
        get("POST", "/v1/profiles/default/rollback", params={"n": 3, "version": 10**20}),
    ),
    "profile-unknown-delete": Case(
        404, "profile_not_found", get("DELETE", "/v1/profiles/nobody", params={"n": 3})
    ),
    "profile-unknown-get": Case(404, "profile_not_found", get("GET", "/v1/profiles/nobody")),
    "profile-bad-name": Case(422, "invalid_request", get("GET", "/v1/profiles/-bad")),
    "unknown-route": Case(404, "not_found", get("GET", "/v1/../../etc/passwd")),
    "method-not-allowed": Case(405, "method_not_allowed", get("PATCH", "/v1/profiles/default")),
    "insane-request-id": Case(
        404,
        "not_found",
        get("GET", "/nope", headers={"X-Request-ID": "bad id\twith spaces" + "x" * 300}),
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
        assert set(error) == {"code", "message", "type", "request_id"}
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
