"""LAD_OVERHEAD_SAMPLE_RATE: sampled batches run again without capture, off the request path;
the live latency overhead of debiasing becomes a metric and the answers do not change."""

from __future__ import annotations

import time

import pytest

from app.service.shadow import overhead_ratio
from tests.api.helpers import metric_value, retrieve_body


def _wait_for(client, name: str, at_least: int, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while True:
        text = client.get("/metrics").text
        if (metric_value(text, name) or 0) >= at_least or time.monotonic() > deadline:
            return text
        time.sleep(0.05)


def test_rate_one_measures_every_batch_and_answers_do_not_change(make_client, items):
    plain, sampled = make_client(), make_client(overhead_sample_rate=1.0)
    for item in items[:3]:
        body = retrieve_body(item, method="attn_raw")
        a = plain.post("/v1/retrieve", json=body).json()
        b = sampled.post("/v1/retrieve", json=body).json()
        assert a["probabilities"] == b["probabilities"] and a["index"] == b["index"]
        assert set(b["timings_ms"]) == set(a["timings_ms"])  # no shadow time in the answer
        _wait_for(sampled, "lad_shadow_forward_seconds_count", 1)
    text = _wait_for(sampled, "lad_debias_latency_overhead_ratio_count", 1)
    measured = metric_value(text, "lad_debias_latency_overhead_ratio_count")
    assert measured is not None and 1 <= measured <= 3  # one waiting sample at a time
    assert metric_value(text, "lad_shadow_forward_seconds_sum") > 0
    off = plain.get("/metrics").text
    assert metric_value(off, "lad_debias_latency_overhead_ratio_count") == 0


def test_rate_zero_starts_no_shadow(client):
    service = client.app.state.service
    assert service.worker.shadow.enabled is False


def test_overhead_ratio_accounts_for_how_the_live_forward_was_timed():
    # live forward includes the processor call: the plain side must include it too
    assert overhead_ratio(
        {"forward": 12.0, "score": 2.0}, {"process": 1.0, "forward": 9.0}
    ) == pytest.approx((12 - 10) / (10 + 2))
    # live timings with a separate process stage: forward against forward
    assert overhead_ratio(
        {"process": 1.0, "forward": 11.0, "score": 2.0}, {"process": 1.0, "forward": 9.0}
    ) == pytest.approx((11 - 9) / (9 + 2))
    with pytest.raises(ValueError):
        overhead_ratio({"forward": 1.0}, {"process": 0.0, "forward": 0.0})
