"""Hardening, round 3 (issue 29): one reading of every request, bounded echoes and log
lines. The one-request cases (duplicate keys, labels with control characters, PPM / PCX /
TGA) are rows of test_hostile.py; here are the ones that look at the answer's size, the
log or the metrics."""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from app import errors
from app.api import bodies
from app.observability.logs import MAX_LOG_LINE_BYTES, JsonFormatter, TextFormatter
from tests.api.helpers import metric_value, retrieve_body

LONG = "M" * 60_000


@pytest.mark.parametrize(
    "body",
    [
        b'{"a": 1, "a": 2}',
        b'{"a": 1, "b": {"c": 1}, "a": 2}',
        b'[{"x": [1, {"k": 1, "k": 2}]}]',
        b'{"method": 1, "\\u006dethod": 2}',
        b'{"a" : 1, "a"\n:\t2}',
    ],
)
def test_a_key_repeated_in_one_object_is_refused(body: bytes) -> None:
    with pytest.raises(errors.InvalidRequest, match="repeats the key"):
        bodies.check_json_shape(body)


@pytest.mark.parametrize(
    "body",
    [
        b'{"a": 1, "b": {"a": 2}}',  # same key in a nested object
        b'[{"a": 1}, {"a": 2}]',  # and in sibling objects
        b'{"a": "a", "b": ["a", "a"]}',  # values are not keys
        b'{"a": "x\\"y", "b": {"a": 1}, "c": 1}',
    ],
)
def test_the_same_key_in_different_objects_passes(body: bytes) -> None:
    bodies.check_json_shape(body)
    json.loads(body)


def test_a_60_kb_method_gets_a_short_405(make_client) -> None:
    client = make_client(raise_server_exceptions=False)
    response = client.request(LONG, "/v1/profiles/default")
    assert response.status_code == 405
    assert len(response.content) < 1000, len(response.content)
    assert "…" in response.json()["error"]["message"]
    text = client.get("/metrics").text  # the verb is no label value: one series for all
    assert LONG[:100] not in text
    count = metric_value(text, "lad_requests_total", http_method="other", status="405")
    assert count == 1.0, [line for line in text.splitlines() if "lad_requests_total{" in line]


def test_echoed_paths_fields_and_keys_are_cut(make_client) -> None:
    client = make_client(raise_server_exceptions=False)
    answers = [
        client.get("/" + "p" * 60_000),
        client.post(
            "/v1/retrieve",
            data={"query": "x", "F" * 3000: "1"},
            files=[("images", ("a.png", b"x", "image/png"))],
        ),
        client.post("/v1/retrieve", json={"query": "x", "images": ["a", "b"], LONG: 1}),
        client.post("/v1/retrieve", content=b"{}", headers={"content-type": LONG}),
    ]
    for response in answers:
        assert 400 <= response.status_code < 500, response.text[:300]
        assert len(response.content) < 1500, (response.status_code, len(response.content))
        assert "…" in response.json()["error"]["message"]


def _record(message: str, **fields: object) -> logging.LogRecord:
    record = logging.LogRecord("lad.request", logging.INFO, __file__, 1, message, None, None)
    record.lad = fields  # type: ignore[attr-defined]
    return record


@pytest.mark.parametrize("formatter", [JsonFormatter(), TextFormatter()], ids=["json", "text"])
def test_a_log_line_is_bounded_whatever_it_echoes(formatter: logging.Formatter) -> None:
    fields = {f"f{i}": "v" * 60_000 for i in range(100)}
    line = formatter.format(_record(LONG, http_method=LONG, **fields))
    assert len(line.encode()) <= MAX_LOG_LINE_BYTES
    if isinstance(formatter, JsonFormatter):
        parsed = json.loads(line)  # still one JSON object
        assert parsed["message"].startswith("MMM") and " … " in parsed["message"]
    tail = formatter.format(_record("x" * 60_000 + " the last line says what failed"))
    assert tail.count("what failed") == 1  # a traceback keeps its last line
    short = formatter.format(_record("GET /x 200", http_method=LONG))
    assert len(short) < 600 and "…" in short


@pytest.mark.slow
def test_a_calibration_storm_leaves_every_retrieve_answered(
    make_client, items, calibrate_json
) -> None:
    """Issue 29: twenty concurrent calibrations filled the one queue and a retrieve sent
    meanwhile got 429. Admin work now holds one wave (at most half the queue) at a time."""
    client = make_client(max_queue=8, max_batch_size=4)
    storm, retrieves = 10, []
    with ThreadPoolExecutor(storm + 1) as pool:
        calibrations = [
            pool.submit(client.post, "/v1/calibrate", json=calibrate_json) for _ in range(storm)
        ]
        time.sleep(0.3)  # the storm's first waves are queued
        while not all(c.done() for c in calibrations):
            body = retrieve_body(items[len(retrieves) % len(items)], method="vanilla")
            retrieves.append(client.post("/v1/retrieve", json=body).status_code)
        versions = sorted(c.result().json()["version"] for c in calibrations)
    assert versions == list(range(1, storm + 1))  # every calibration succeeded, unique versions
    assert len(retrieves) >= 3 and set(retrieves) == {200}, retrieves


def test_the_replica_wide_byte_budget_queues_bodies_and_refuses_with_retry_after(
    make_client, items, monkeypatch
) -> None:
    """Issue 29: every bound was per request. Bodies and decoded pixels in flight now share
    LAD_MAX_INFLIGHT_BYTES: a body that does not fit waits, then 429 with Retry-After."""
    monkeypatch.setattr("app.budget.BUDGET_WAIT_S", 0.3)
    client = make_client(raise_server_exceptions=False, max_inflight_bytes=4 * 1024 * 1024)
    budget = client.app.state.service.budget
    plain = json.dumps(retrieve_body(items[0], method="vanilla")).encode()
    content = plain[:-1] + b" " * 200_000 + b"}"  # a body of ~210 KB: reserved
    headers = {"content-type": "application/json"}

    def send() -> Any:
        return client.post("/v1/retrieve", content=content, headers=headers)

    assert send().status_code == 200
    assert budget.used == 0 and budget.peak >= 3 * 200_000  # three copies of the body
    text = client.get("/metrics").text
    assert metric_value(text, "lad_inflight_bytes_capacity") == 4 * 1024 * 1024
    assert metric_value(text, "lad_inflight_bytes") == 0
    held = budget.reserve(4 * 1024 * 1024 - 1000, "another request", kind="growth")  # full
    refused = send()
    assert refused.status_code == 429 and refused.headers["retry-after"] == "2"
    assert "LAD_MAX_INFLIGHT_BYTES" in refused.json()["error"]["message"]
    small = client.post("/v1/retrieve", json=retrieve_body(items[0], method="vanilla"))
    assert small.status_code == 429  # its decoded pixels do not fit either
    assert client.get("/healthz").status_code == 200  # probes hold nothing
    budget.release(held)
    assert send().status_code == 200
    assert budget.used == 0
