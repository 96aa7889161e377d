"""The request log: one line per request with its facts, audit lines for admin actions,
no lines for scrapes and probes unless they fail, the request id in and out."""

from __future__ import annotations

import json
import logging

import pytest

from app.observability.logs import JsonFormatter, TextFormatter
from tests.api.helpers import retrieve_body


def request_lines(caplog: pytest.LogCaptureFixture, logger: str = "lad.request") -> list[dict]:
    return [dict(r.lad, message=r.getMessage()) for r in caplog.records if r.name == logger]


def test_one_line_per_request_with_method_n_profile_version(
    make_client, items, calibrate_json, caplog
):
    client = make_client()
    client.post("/v1/calibrate", json=calibrate_json)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lad"):
        ok = client.post(
            "/v1/retrieve", json=retrieve_body(items[0]), headers={"X-Request-ID": "trace-42"}
        )
        missing = client.post("/v1/retrieve", json=retrieve_body(items[1], profile="other"))
        client.get("/metrics")
        client.get("/healthz")
    assert ok.headers["x-request-id"] == "trace-42"
    generated = missing.headers["x-request-id"]
    assert len(generated) == 32 and generated != "trace-42"
    first, second = request_lines(caplog)  # nothing for /metrics and /healthz
    assert first["request_id"] == "trace-42" and first["route"] == "/v1/retrieve"
    assert first["status"] == 200 and first["method"] == "agd" and first["n"] == 3
    assert first["profile"] == "default" and first["labels"] == "digits"
    assert first["version"] == 1 and first["latency_ms"] > 0 and "error_code" not in first
    assert second["request_id"] == generated and second["status"] == 409
    assert second["error_code"] == "calibration_required" and second["profile"] == "other"


def test_ten_probes_leave_no_line_and_a_failing_probe_one(make_client, caplog):
    client = make_client()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lad"):
        for path in ["/healthz", "/readyz", "/metrics"] * 4:
            assert client.get(path).status_code == 200
        assert request_lines(caplog) == []
        client.app.state.service = None  # not ready: /readyz answers 503
        for _ in range(10):
            assert client.get("/healthz").status_code == 200
        assert client.get("/readyz").status_code == 503
    (line,) = request_lines(caplog)
    assert line["route"] == "/readyz" and line["status"] == 503


def test_probes_are_logged_at_debug_level(make_client, caplog):
    client = make_client()
    with caplog.at_level(logging.DEBUG, logger="lad.request"):
        client.get("/readyz")
    (record,) = [r for r in caplog.records if r.name == "lad.request"]
    assert record.levelno == logging.DEBUG and record.lad["route"] == "/readyz"


def test_fallback_requests_say_so(make_client, items, caplog):
    client = make_client(fallback_to_vanilla=True)
    with caplog.at_level(logging.INFO, logger="lad"):
        client.post("/v1/retrieve", json=retrieve_body(items[0]))
    (line,) = request_lines(caplog)
    assert line["method"] == "vanilla" and line["requested_method"] == "agd"
    assert line["fallback"] is True


def test_admin_actions_write_audit_lines_naming_the_token_and_version(
    make_client, calibrate_json, caplog
):
    client = make_client(admin_token="s3cret-admin", retrieve_token="s3cret-retrieve")
    admin = {"Authorization": "Bearer s3cret-admin"}
    with caplog.at_level(logging.INFO, logger="lad"):
        client.post("/v1/calibrate", json=calibrate_json, headers=admin)
        client.post("/v1/calibrate", json=calibrate_json, headers=admin)
        client.post("/v1/profiles/default/rollback?n=3", headers=admin)
        client.delete(
            "/v1/profiles/default?n=3", headers={"Authorization": "Bearer s3cret-retrieve"}
        )  # refused
        client.delete("/v1/profiles/default?n=3", headers=admin)
    audit = request_lines(caplog, "lad.audit")
    assert [a["action"] for a in audit] == [
        "calibrate",
        "calibrate",
        "rollback",
        "delete",
        "delete",
    ]
    assert [a.get("version") for a in audit] == [1, 2, 1, None, 1]
    assert audit[2]["previous_version"] == 2
    assert [a["by"] for a in audit] == ["admin"] * 3 + ["unauthenticated", "admin"]
    assert audit[3]["status"] == 403 and audit[3]["error_code"] == "forbidden"
    assert all(a["profile"] == "default" and a["n"] == 3 for a in audit if a["status"] == 200)
    assert "s3cret" not in json.dumps(audit)


def test_open_admin_routes_are_audited_as_open(client, calibrate_json, caplog):
    with caplog.at_level(logging.INFO, logger="lad"):
        client.post("/v1/calibrate", json=calibrate_json)
    (line,) = request_lines(caplog, "lad.audit")
    assert line["by"] == "open" and line["version"] == 1


def test_json_and_text_formats_carry_the_fields(make_client, items, caplog):
    client = make_client()
    with caplog.at_level(logging.INFO, logger="lad"):
        client.post(
            "/v1/retrieve",
            json=retrieve_body(items[0], method="vanilla"),
            headers={"X-Request-ID": "abc"},
        )
    (record,) = [r for r in caplog.records if r.name == "lad.request"]
    line = json.loads(JsonFormatter().format(record))
    assert line["logger"] == "lad.request" and line["level"] == "info"
    assert line["request_id"] == "abc" and line["method"] == "vanilla" and line["status"] == 200
    assert line["message"].startswith("POST /v1/retrieve 200")
    text = TextFormatter().format(record)
    assert "request_id=abc" in text and "method=vanilla" in text and "\n" not in text


def test_insane_request_ids_are_replaced(client):
    r = client.get("/healthz", headers={"X-Request-ID": "bad id with spaces"})
    assert r.headers["x-request-id"] != "bad id with spaces"
    assert len(r.headers["x-request-id"]) == 32
