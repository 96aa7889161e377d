"""The handlers called directly, without HTTP: the stage runner's order and timings on a
toy handler, then retrieve, rerank, calibrate, feedback and refresh over a real Service
(tiny Qwen, memory store), each answering its wire schema or the service's own error."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from typing import Any

import pytest

from app import errors
from app.observability.metrics import Metrics
from app.service import Service
from app.service.pipeline import STAGES, TIMINGS, Context, Handler
from app.settings import Settings
from calibration_store import open_store
from lad_client.types import (
    CalibrateRequest,
    FeedbackRequest,
    RerankOptions,
    RerankRequest,
    RetrieveOptions,
)
from lad_lab.demo.world import RetrievalExample, make_items
from tests.api.helpers import b64, calibration_body, png_bytes


class Recording(Handler[Context, dict[str, float]]):
    """A feature whose hooks note their order and take a known stage's time."""

    def __init__(self, pipeline: Any) -> None:
        super().__init__(pipeline)
        self.order: list[str] = []
        self.wire: dict[str, float] = {}

    async def decode(self, ctx: Context) -> None:
        self.order.append("decode")
        ctx.timings["base64"] = 0.5

    async def plan(self, ctx: Context) -> None:
        self.order.append("plan")

    async def run(self, ctx: Context) -> None:
        self.order.append("run")
        for key in ("queue", "process", "forward", "score"):
            ctx.add(key, 1.0)

    async def debias(self, ctx: Context) -> None:
        self.order.append("debias")

    async def encode(self, ctx: Context) -> dict[str, float]:
        self.order.append("encode")
        return self.wire

    def timings_of(self, response: dict[str, float]) -> dict[str, float]:
        return response


class _Pipeline:
    """What ``Pipeline.serve`` reads besides its handler: the metrics."""

    def __init__(self) -> None:
        self.metrics = Metrics()


def test_the_runner_runs_every_stage_in_order_and_times_it_under_the_one_vocabulary() -> None:
    from app.service.pipeline import Pipeline

    pipeline: Any = _Pipeline()
    handler = Recording(pipeline)
    wire = asyncio.run(Pipeline.serve(pipeline, handler, Context(method="vanilla")))
    assert handler.order == [s.name for s in STAGES if s.inside is None]  # fetch: in decode
    assert tuple(wire) == TIMINGS  # every key, in the tuple's order, nothing else
    text = pipeline.metrics.render()[0].decode()
    for key in TIMINGS:
        assert f'lad_stage_duration_seconds_count{{method="vanilla",stage="{key}"}} 1.0' in text
    with pytest.raises(AssertionError):
        Context().add("total", 1.0)  # not a stage key


class Fetching(Recording):
    """A decode hook that runs the fetch stage inside it (as the features do for URLs)."""

    async def decode(self, ctx: Context) -> None:
        started = time.perf_counter()
        await asyncio.sleep(0.05)
        ctx.add("fetch", (time.perf_counter() - started) * 1e3)


def test_a_stage_run_inside_another_is_reported_apart_from_it() -> None:
    from app.service.pipeline import Pipeline

    pipeline: Any = _Pipeline()
    wire = asyncio.run(Pipeline.serve(pipeline, Fetching(pipeline), Context(method="vanilla")))
    assert wire["fetch"] >= 50 and wire["decode"] < 25  # the fetch is not decode's time
    wire = asyncio.run(Pipeline.serve(pipeline, Recording(pipeline), Context(method="vanilla")))
    assert wire["fetch"] == 0.0  # nothing to fetch: present, at 0


@pytest.fixture(scope="module")
def items() -> list[RetrievalExample]:
    return make_items(3, n_candidates=3, setting="random", seed="eval", image_size=56)


@pytest.fixture
def service(shared_runner: Any) -> Iterator[Service]:
    settings = Settings(_env_file=None, store_url="memory://")
    built = Service(settings, shared_runner("qwen2_5_vl"), open_store("memory://"), Metrics())
    built.start()
    yield built
    built.stop()


def test_retrieve_rerank_calibrate_feedback_refresh_without_http(
    service: Service, items: list[RetrievalExample]
) -> None:
    handlers, item = service.handlers, items[0]
    images = [b64(img) for img in item.images]

    async def scenario() -> None:
        with pytest.raises(errors.CalibrationRequired):
            await handlers.retrieve(RetrieveOptions(method="agd"), item.query, images)
        body = calibration_body(make_items(5, n_candidates=3, seed="calibration", image_size=56))
        calibrated = await handlers.calibrate(CalibrateRequest.model_validate(body))
        assert calibrated.version == 1 and calibrated.n == 3
        answer = await handlers.retrieve(RetrieveOptions(method="agd"), item.query, images)
        assert answer.profile is not None and answer.profile.version == 1
        assert tuple(answer.timings_ms) == TIMINGS
        # a form's documents are file parts: echoed in base64, scored as the images
        parts = [png_bytes(img) for img in item.images]
        form = await handlers.rerank(RerankOptions(return_documents=True), item.query, parts)
        assert [r.document for r in form.results] == [
            {"text": base64.b64encode(parts[r.index]).decode("ascii")} for r in form.results
        ]
        assert set(form.meta.timings_ms) == set(TIMINGS)
        as_json = RerankRequest(query=item.query, documents=images, return_documents=True)
        sent = await handlers.rerank(as_json, item.query, [])
        assert [r.document for r in sent.results] == [
            {"text": images[r.index]} for r in sent.results
        ]
        with pytest.raises(errors.ModelNotFound):
            await handlers.rerank(RerankOptions(model="another"), item.query, parts)
        assert answer.request_id is None  # no HTTP request: nothing kept for feedback
        with pytest.raises(errors.RequestNotFound):
            await handlers.feedback(FeedbackRequest(request_id="r" * 16, answer=0))
        refreshed = await handlers.refresh("default", "digits", 3, False)
        assert refreshed.live is False and refreshed.previous_version == 1  # no feedback yet
        with pytest.raises(errors.ProfileNotFound):
            await handlers.refresh("nobody", "digits", 3, False)
        with pytest.raises(errors.InvalidLabels):
            await handlers.refresh("default", "[1,", 3, False)

    asyncio.run(scenario())
