"""OpenTelemetry traces: real OTLP/HTTP export to a receiver on 127.0.0.1 (the protobuf bodies
decoded with opentelemetry-proto), the span tree of a retrieve and a rerank (request span,
one child per pipeline stage, the batches, the request id, the caller's trace), an error's
status; and nothing exported, no exporter thread, when no endpoint is set."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from app.main import create_app
from app.observability import tracing
from app.service.pipeline import RETRIEVAL_STAGES as STAGES
from app.settings import Settings
from lad_lab.demo.world import RetrievalExample
from tests.api.helpers import b64, png_bytes, retrieve_body
from tests.media_server import MediaServer
from tests.otlp import Receiver, attributes, stage_children

TOP = [stage.name for stage in STAGES if stage.inside is None]
"""The request span's children (fetch is a child of decode, when there is a URL)."""
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def no_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*tracing.ENDPOINT_VARIABLES, "OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def exporting(receiver: Receiver, monkeypatch: pytest.MonkeyPatch, no_otel_env: None) -> Receiver:
    """OTEL_EXPORTER_OTLP_ENDPOINT names the receiver (and nothing else of the caller's)."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    return receiver


def test_spans_reach_an_otlp_receiver(
    make_client: Any,
    exporting: Receiver,
    items: list[RetrievalExample],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    receiver = exporting
    monkeypatch.setenv("OTEL_SERVICE_NAME", "lad-under-test")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-collector-token=s3cret")
    client = make_client()
    assert tracing.enabled()
    traceparent = f"00-{TRACE_ID}-{PARENT_ID}-01"
    r = client.post(
        "/v1/retrieve",
        json=retrieve_body(items[0], method="vanilla"),
        headers={"traceparent": traceparent, "X-Request-ID": "trace-me-1"},
    )
    assert r.status_code == 200, r.text
    documents = [b64(img) for item in items[:2] for img in item.images]  # 6: two windows
    r = client.post(
        "/v1/rerank",
        json={"query": items[0].query, "documents": documents, "method": "vanilla", "window": 3},
        headers={"X-Request-ID": "trace-me-2"},
    )
    assert r.status_code == 200, r.text
    r = client.post("/v1/retrieve", json=retrieve_body(items[1]), headers={"X-Request-ID": "e"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "calibration_required"
    assert client.get("/healthz").status_code == 200
    assert tracing.force_flush()

    assert receiver.paths and set(receiver.paths) == {"/v1/traces"}
    assert all(h.get("x-collector-token") == "s3cret" for h in receiver.headers)
    received = receiver.spans()
    assert {res["service.name"] for res, _ in received} == {"lad-under-test"}
    spans = [span for _, span in received]
    requests = {
        attributes(s.attributes).get("lad.request_id"): s
        for s in spans
        if s.kind == Span.SPAN_KIND_SERVER
    }
    assert set(requests) == {"trace-me-1", "trace-me-2", "e"}  # no span for the probe

    retrieve = requests["trace-me-1"]
    assert retrieve.name == "POST /v1/retrieve"
    assert retrieve.trace_id.hex() == TRACE_ID and retrieve.parent_span_id.hex() == PARENT_ID
    attrs = attributes(retrieve.attributes)
    assert attrs["http.route"] == "/v1/retrieve" and attrs["http.request.method"] == "POST"
    assert attrs["http.response.status_code"] == 200 and attrs["lad.method"] == "vanilla"
    assert attrs["lad.batch.count"] == 1 and len(attrs["lad.batch.ids"]) == 1
    assert attrs["lad.batch.sizes"][0] >= 1
    assert retrieve.status.code != Status.STATUS_CODE_ERROR
    children = stage_children(spans, retrieve)
    assert [c.name for c in children] == TOP
    assert all(c.trace_id == retrieve.trace_id for c in children)
    run = next(c for c in children if c.name == "run")
    assert attributes(run.attributes)["lad.batch.ids"] == attrs["lad.batch.ids"]

    rerank = requests["trace-me-2"]
    assert rerank.name == "POST /v1/rerank" and len(rerank.parent_span_id) == 0  # a new trace
    attrs = attributes(rerank.attributes)
    assert attrs["http.route"] == "/v1/rerank" and attrs["lad.batch.count"] >= 1
    assert len(attrs["lad.batch.ids"]) == len(attrs["lad.batch.sizes"]) == attrs["lad.batch.count"]
    assert [c.name for c in stage_children(spans, rerank)] == TOP

    refused = requests["e"]
    assert refused.status.code == Status.STATUS_CODE_ERROR
    assert refused.status.message == "calibration_required"
    attrs = attributes(refused.attributes)
    assert (
        attrs["error.type"] == "calibration_required" and attrs["http.response.status_code"] == 409
    )


def test_the_fetch_of_image_urls_is_a_span_inside_decode(
    make_client: Any, exporting: Receiver, items: list[RetrievalExample]
) -> None:
    client = make_client(
        media_allowed_domains=["127.0.0.1"], media_allowed_networks=["127.0.0.1/32"]
    )
    with MediaServer() as images:
        urls = [images.add(f"{i}.png", png_bytes(im)) for i, im in enumerate(items[0].images)]
        body = {"query": items[0].query, "method": "vanilla", "images": urls}
        r = client.post("/v1/retrieve", json=body, headers={"X-Request-ID": "by-url"})
    assert r.status_code == 200, r.text
    assert tracing.force_flush()
    spans = [span for _, span in exporting.spans()]
    request = next(s for s in spans if attributes(s.attributes).get("lad.request_id") == "by-url")
    children = stage_children(spans, request)
    assert [c.name for c in children] == TOP
    decode = next(c for c in children if c.name == "decode")
    assert [c.name for c in stage_children(spans, decode)] == ["fetch"]


def test_the_service_stop_flushes_the_buffered_spans(
    runner: Any, exporting: Receiver, items: list[RetrievalExample], monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = exporting
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")  # nothing leaves before the stop
    app = create_app(Settings(_env_file=None, store_url="memory://"), runner=runner)
    with TestClient(app) as client:
        r = client.post("/v1/retrieve", json=retrieve_body(items[0], method="vanilla"))
        assert r.status_code == 200, r.text
        assert receiver.requests == []
    assert not tracing.enabled()
    names = {span.name for _, span in receiver.spans()}
    assert names == {"POST /v1/retrieve", *TOP}


def test_a_collector_that_never_answers_holds_the_stop_at_most_the_bound(
    monkeypatch: pytest.MonkeyPatch, no_otel_env: None
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # connects, never answers
        port = silent.getsockname()[1]
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
        assert tracing.setup()
        with tracing.stage_span("decode"):
            pass
        started = time.monotonic()
        tracing.shutdown(timeout_s=1.0)
        assert time.monotonic() - started < 3.0
        assert not tracing.enabled()


def test_no_endpoint_no_export_no_thread(
    make_client: Any, receiver: Receiver, items: list[RetrievalExample], no_otel_env: None
) -> None:
    before = {t.ident for t in threading.enumerate()}
    client = make_client()
    assert not tracing.enabled()
    r = client.post(
        "/v1/retrieve",
        json=retrieve_body(items[0], method="vanilla"),
        headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"},
    )
    assert r.status_code == 200, r.text
    assert tracing.force_flush()
    started = [t.name for t in threading.enumerate() if t.ident not in before]
    assert not [name for name in started if "otel" in name.lower()], started
    assert receiver.paths == []


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "TRUE"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "otlp"}, True),
    ],
)
def test_which_variables_turn_tracing_on(environ: dict[str, str], expected: bool) -> None:
    assert tracing.wanted(environ) is expected
