"""Requests that cost far more than their size (issue 19): refused fast, the event loop
answering meanwhile, and library warnings a few log lines, not thousands.

The one-request cases (each bound, each format) are rows of test_hostile.py; here are the
ones that need a second request at the same time or the service's log. Their cost is
measured by ``lad bench hardening``, not asserted to the millisecond here.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest

from app import errors
from app.api import bodies
from app.observability.logs import WarningLimiter, configure_logging
from lad_lab.testing import hostile
from tests.api.helpers import retrieve_body


def test_a_json_key_flood_is_refused_while_healthz_keeps_answering(make_client) -> None:
    client = make_client(raise_server_exceptions=False)
    flood = hostile.json_unknown_keys(1_000_000)  # 13 MB; main: ~15 s on the event loop
    waits: list[float] = []
    with ThreadPoolExecutor(1) as pool:
        sent = pool.submit(
            client.post, "/v1/retrieve", content=flood, headers={"content-type": "application/json"}
        )
        while not sent.done():
            start = time.perf_counter()
            assert client.get("/healthz").status_code == 200
            waits.append(time.perf_counter() - start)
        response = sent.result()
    assert response.status_code == 422
    assert max(waits, default=0.0) < 3.0, waits
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and "strings" in error["message"]


def test_json_is_parsed_off_the_event_loop(make_client, items, monkeypatch) -> None:
    on_loop: list[bool] = []
    check = bodies.check_json_shape

    def spy(body: bytes) -> None:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        check(body)

    monkeypatch.setattr(bodies, "check_json_shape", spy)
    client = make_client()
    assert (
        client.post("/v1/retrieve", json=retrieve_body(items[0], method="vanilla")).status_code
        == 200
    )
    assert on_loop == [False]


def test_pillow_warning_floods_become_a_few_json_log_lines(make_client, items, capfd) -> None:
    """5,000 EXIF tags that each make Pillow warn (a distinct message each) -> one line."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    warning_png = hostile.png_with_exif(hostile.exif_with_broken_tags(5000))
    body = retrieve_body(items[0], method="vanilla")
    body["images"][1] = base64.b64encode(warning_png).decode()
    try:
        with warnings.catch_warnings():
            configure_logging("info", "json")
            client = make_client()
            for _ in range(3):
                assert client.post("/v1/retrieve", json=body).status_code == 200
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
    err = capfd.readouterr().err
    # Pillow 13 warns once per tag ("... Skipping tag N"), Pillow 10.0 once per file
    lines = [line for line in err.splitlines() if '"logger": "lad.warnings"' in line]
    assert 1 <= len(lines) <= 3, lines[:5]
    record = json.loads(lines[0])
    assert record["level"] == "warning" and record["category"] == "UserWarning"
    assert "PIL" in record["source"], record


def test_the_json_shape_check_bounds_strings_depth_and_skeleton_exactly() -> None:
    def strings(n: int) -> bytes:
        return b"[" + b",".join([b'"a\\"b\\\\"'] * n) + b"]"  # escaped quotes and backslashes

    bodies.check_json_shape(strings(bodies.MAX_JSON_STRINGS))
    nested = bodies.MAX_JSON_DEPTH
    bodies.check_json_shape(b"[" * nested + b'"[[[[{{{{"' + b"]" * nested)  # brackets in a string
    bodies.check_json_shape(b" " * bodies.MAX_JSON_SKELETON_BYTES + b'"x"')
    bodies.check_json_shape(b'{"unterminated": "' + b"x" * 10**6)  # left to the parser
    for body, what in [
        (strings(bodies.MAX_JSON_STRINGS + 1), "strings"),
        (b"[" * (nested + 1) + b"]" * (nested + 1), "nests deeper"),
        (b" " * (bodies.MAX_JSON_SKELETON_BYTES + 1), "outside its strings"),
        (b"[" + b"1," * 200_000 + b"1]", "outside its strings"),
    ]:
        with pytest.raises(errors.InvalidRequest, match=what):
            bodies.check_json_shape(body)


def test_the_warning_limiter_writes_one_line_per_place_then_the_count_left_out(caplog) -> None:
    limiter = WarningLimiter(interval_s=0.2)
    with caplog.at_level(logging.WARNING, logger="lad.warnings"):
        for i in range(100):
            limiter(UserWarning(f"tag {i}"), UserWarning, "PIL/TiffImagePlugin.py", 946)
        limiter(UserWarning("elsewhere"), UserWarning, "PIL/Image.py", 10)
        time.sleep(0.25)
        limiter(UserWarning("tag 100"), UserWarning, "PIL/TiffImagePlugin.py", 946)
    lines = [(r.getMessage(), r.lad.get("left_out")) for r in caplog.records]
    assert lines == [("tag 0", None), ("elsewhere", None), ("tag 100", 99)]
