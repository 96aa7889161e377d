"""docs/api.md's limits table says what a client gets one step past each limit; here the
service is asked, one step past, and must answer exactly that (issue 41 point 9: the page
said 65 rerank documents were refused while the service took up to 256). The table is read
from the page, so a stale row fails here even when the generator agrees with itself."""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from typing import Any

import pytest
from PIL import Image

from tests.api.helpers import b64, png_bytes
from tools.docs.limits import PAGE, page_block

Probe = Callable[[Any], Any]


def _rows() -> dict[str, list[str]]:
    """Each row of the limits table by its setting (``LAD_...``) or, for a fixed limit,
    its first cell."""
    block = page_block(PAGE.read_text())
    assert block is not None
    rows: dict[str, list[str]] = {}
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[1] != "Setting" and not cells[1].startswith(":"):
            rows[cells[1].strip("`") if cells[1] != "fixed" else cells[0]] = cells
    return rows


def _promised(cell: str) -> tuple[int, str]:
    found = re.search(r"(\d{3}) `([a-z_]+)`", cell)
    assert found, cell
    return int(found.group(1)), found.group(2)


def _image(fmt: str = "PNG", size: tuple[int, int] = (16, 16)) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buffer, format=fmt)
    import base64

    return base64.b64encode(buffer.getvalue()).decode()


def _retrieve(images: int, **extra: Any) -> dict[str, Any]:
    return {"query": "a red circle", "images": [_image()] * images, "method": "vanilla", **extra}


def _rerank(documents: int) -> dict[str, Any]:
    return {"query": "a red circle", "documents": [_image()] * documents, "method": "vanilla"}


def _fixed_range(value: str) -> int:
    """One past a fixed range's top ("2 .. 64" -> 65); "at least 1" -> 0 (one below)."""
    if ".." in value:
        return int(value.split("..")[1].strip()) + 1
    least = re.fullmatch(r"at least (\d+)", value)
    assert least, value
    return int(least.group(1)) - 1


SETTING_PROBES: dict[str, tuple[dict[str, Any], Probe]] = {
    "LAD_MAX_IMAGES": ({}, lambda c: c.post("/v1/retrieve", json=_retrieve(13))),
    "LAD_MAX_RERANK_CANDIDATES": (
        {"max_rerank_candidates": 4},
        lambda c: c.post("/v1/rerank", json=_rerank(5)),
    ),
    "LAD_MAX_QUERY_CHARS": (
        {"max_query_chars": 10},
        lambda c: c.post("/v1/retrieve", json=_retrieve(2, query="x" * 11)),
    ),
    "LAD_MAX_IMAGE_BYTES": (
        {"max_image_bytes": 100},
        lambda c: c.post(
            "/v1/retrieve",
            json=_retrieve(2) | {"images": [b64(Image.new("RGB", (64, 64), (1, 2, 3)))] * 2},
        ),
    ),
    "LAD_MAX_BODY_BYTES": (
        {"max_body_bytes": 2000},
        lambda c: c.post("/v1/retrieve", json=_retrieve(2, query="x" * 3000)),
    ),
    "LAD_IMAGE_FORMATS": (
        {},
        lambda c: c.post("/v1/retrieve", json=_retrieve(2) | {"images": [_image("TIFF")] * 2}),
    ),
}


@pytest.mark.parametrize("setting", sorted(SETTING_PROBES))
def test_one_past_a_setting_answers_what_the_table_says(make_client, setting: str) -> None:
    overrides, probe = SETTING_PROBES[setting]
    answer = probe(make_client(**overrides))
    status, code = _promised(_rows()[setting][3])
    assert (answer.status_code, answer.json()["error"]["code"]) == (status, code), answer.text


FIXED_PROBES: dict[str, Callable[[int], tuple[str, dict[str, Any]]]] = {
    "documents per rerank request": lambda n: ("/v1/rerank", _rerank(n)),
    "N (images per request": lambda n: ("/v1/retrieve", _retrieve(n)),
    "calibration examples M": lambda n: (
        "/v1/calibrate",
        {
            "profile": "p",
            "examples": [{"query": "q", "images": [_image()] * 3, "answer": 0}] * n,
        },
    ),
}


@pytest.mark.parametrize("start", sorted(FIXED_PROBES))
def test_one_past_a_fixed_limit_answers_what_the_table_says(client, start: str) -> None:
    (row,) = [cells for key, cells in _rows().items() if key.startswith(start)]
    path, body = FIXED_PROBES[start](_fixed_range(row[2]))
    answer = client.post(path, json=body)
    status, code = _promised(row[3])
    assert (answer.status_code, answer.json().get("error", {}).get("code")) == (status, code), (
        row,
        answer.status_code,
    )


def test_the_multipart_files_bound_is_the_routes_own(client) -> None:
    """Rerank's form takes LAD_MAX_RERANK_CANDIDATES files, retrieve's LAD_MAX_IMAGES."""
    image = png_bytes(Image.new("RGB", (16, 16), (200, 30, 30)))
    files = [("images", (f"{i}.png", image, "image/png")) for i in range(13)]
    answer = client.post("/v1/retrieve", data={"query": "q", "method": "vanilla"}, files=files)
    assert answer.status_code == 422 and answer.json()["error"]["code"] == "too_many_images"
    files = [("documents", (f"{i}.png", image, "image/png")) for i in range(13)]
    answer = client.post("/v1/rerank", data={"query": "q", "method": "vanilla"}, files=files)
    assert answer.status_code == 200, answer.text
