"""A real `lad serve` (the demo model) exporting its spans to an OTLP/HTTP receiver on
127.0.0.1: with the batch processor's delay at ten minutes nothing leaves before the stop,
so the spans that arrive were flushed by the SIGTERM shutdown."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import httpx
import pytest

from app.service.pipeline import RETRIEVAL_STAGES as STAGES
from tests.live import ROOT, LiveService
from tests.otlp import Receiver, attributes, stage_children

IMAGES = ROOT / "examples" / "images"


@pytest.mark.slow
def test_lad_serve_exports_its_spans_and_flushes_them_at_stop(tmp_path: Path) -> None:
    receiver = Receiver()
    service = LiveService(
        tmp_path,
        {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{receiver.url}/v1/traces",
            "OTEL_BSP_SCHEDULE_DELAY": "600000",
            "OTEL_SERVICE_NAME": "lad-live",
        },
    )
    try:
        service.start()
        names = ["large-red-circle-top-plain.png", "small-blue-circle-right-checkered.png"]
        images = [base64.b64encode((IMAGES / n).read_bytes()).decode() for n in names]
        r = httpx.post(
            f"{service.url}/v1/retrieve",
            json={"query": "a large red circle", "images": images, "method": "vanilla"},
            headers={"X-Request-ID": "live-trace-1"},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        time.sleep(0.5)
        assert receiver.requests == []  # buffered: the delay is ten minutes
        service.signal()
        assert service.proc is not None and service.proc.wait(timeout=60) == 0
    finally:
        service.stop()
        receiver.close()
    received = receiver.spans()
    assert {res["service.name"] for res, _ in received} == {"lad-live"}
    spans = [span for _, span in received]
    (request,) = [s for s in spans if attributes(s.attributes).get("http.route")]
    attrs = attributes(request.attributes)
    assert request.name == "POST /v1/retrieve" and attrs["lad.request_id"] == "live-trace-1"
    assert attrs["lad.batch.count"] == 1
    top = [s.name for s in STAGES if s.inside is None]  # fetch runs inside decode
    assert [c.name for c in stage_children(spans, request)] == top
    assert "exporting traces over OTLP/HTTP" in service.log()
