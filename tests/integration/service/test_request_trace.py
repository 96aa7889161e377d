"""One request traced through the project's own files (``tracing``): the labels of an agd
retrieve on the tiny Qwen are resolved once end to end (the service resolves them, the
runner reads them from the Work), calibrate and rerank resolve once per label set, and the
retrieve crosses at most ``MAX_FILES`` project files.

The spy is ``resolve_labels``, the one function every resolution of a labels value to its
N strings goes through (``Labels.resolve`` calls it, so did the runner's re-resolution).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.service.pipeline import TIMINGS
from app.settings import Settings
from calibration_store import open_store
from lad_lab.demo.world import RetrievalExample, make_items
from tests.api.helpers import calibration_body, retrieve_body
from tests.integration.service.tracing import Trace, traced

MAX_FILES = 36
"""Project files one agd retrieve crosses: exactly 36 (38 before the stage runner, 36 once
the encoder cache joined; then label scoring became one module, the prompt text joined the
labels, the Qwen pixel inputs one module, the body limits resolved when the guard is built,
and a forwarder went: 30; then three jobs the request path did not have joined it: the
trace spans (``app/observability/tracing.py``), the client's disconnect and deadline
(``app/api/lifetime.py``, which asks the wire table, ``lad_client/routes.py``, whether the
route takes ``X-Request-Timeout``), and the request's id and stage apart from the error
taxonomy (``app/observability/request_context.py``); then two from the hardening: the
release of freed memory after a batch (``app/engine/host_memory.py``) and the feedback
evidence written off the request path (``app/service/evidence_writes.py``)). The engine
and the model family account for 11 of them."""


@pytest.fixture(scope="module")
def items() -> list[RetrievalExample]:
    return make_items(3, n_candidates=3, setting="random", seed="eval", image_size=56)


@pytest.fixture(scope="module")
def calibration_items() -> list[RetrievalExample]:
    return make_items(5, n_candidates=3, setting="random", seed="calibration", image_size=56)


@pytest.fixture
def app_trace(shared_runner: Any) -> Iterator[tuple[TestClient, Trace]]:
    """A started app whose every thread is traced (recording only inside ``record``)."""
    runner = shared_runner("qwen2_5_vl")
    with traced() as trace:
        settings = Settings(_env_file=None, store_url="memory://")
        app = create_app(settings, runner=runner, store=open_store("memory://"))
        with TestClient(app) as client:
            yield client, trace


def test_an_agd_retrieve_resolves_its_labels_once_end_to_end(
    app_trace: tuple[TestClient, Trace], items: list[RetrievalExample], calibration_items: Any
) -> None:
    client, trace = app_trace
    with trace.record():
        done = client.post("/v1/calibrate", json=calibration_body(calibration_items))
    assert done.status_code == 200, done.text
    assert trace.label_resolutions == 1  # one N, one label set
    client.post("/v1/retrieve", json=retrieve_body(items[1]))  # warm: caches, threads
    with trace.record():
        answer = client.post("/v1/retrieve", json=retrieve_body(items[0], method="agd"))
    assert answer.status_code == 200, answer.text
    assert answer.json()["method"] == "agd" and answer.json()["profile"] is not None
    assert trace.label_resolutions == 1, sorted(k for k in trace.calls if "labels" in k[0])
    assert ("app/engine/runner.py", "forward") in trace.calls  # the model did run
    assert len(trace.files) <= MAX_FILES, "\n".join(sorted(trace.files))
    assert "app/service/core.py" not in trace.files  # the route calls its handler


def test_calibrate_and_rerank_resolve_once_per_label_set(
    app_trace: tuple[TestClient, Trace], items: list[RetrievalExample], calibration_items: Any
) -> None:
    client, trace = app_trace
    body = calibration_body(calibration_items, n=[2, 3])
    with trace.record():
        done = client.post("/v1/calibrate", json=body)
    assert done.status_code == 200, done.text
    assert [row["n"] for row in done.json()["per_n"]] == [2, 3]
    assert trace.label_resolutions == 2  # N = 2 and N = 3, whatever the examples
    documents = [d for it in items for d in retrieve_body(it)["images"]][:7]
    request = {"query": items[0].query, "documents": documents, "method": "agd", "window": 3}
    with trace.record():
        answer = client.post("/v1/rerank", json={**request, "seed": 1})
    assert answer.status_code == 200, answer.text
    sizes = {n for window in answer.json()["meta"]["windows"] for n in window}
    assert len(sizes) == 2 and trace.label_resolutions == len(sizes)  # once per window size
    assert set(answer.json()["meta"]["timings_ms"]) == set(TIMINGS)  # one vocabulary
