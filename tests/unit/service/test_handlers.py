"""The handlers called directly, without HTTP: the stage timer's order and timings, then
retrieve, rerank, calibrate, feedback and refresh over a real Service
(tiny Qwen, memory store), each answering its wire schema or the service's own error."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from typing import Any

import pytest

from app import errors
from app.observability.metrics import Metrics
from app.service import Service
from app.service.pipeline import (
    DEBIAS,
    DECODE,
    ENCODE,
    FETCH,
    PLAN,
    RETRIEVAL_STAGES,
    RUN,
    STAGE_KEYS,
    TIMINGS,
    Context,
    stage,
)
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


class _Pipeline:
    """What ``Pipeline.finish`` reads: the metrics."""

    def __init__(self) -> None:
        self.metrics = Metrics()


def test_the_stages_are_timed_in_order_under_the_one_vocabulary() -> None:
    """A feature's stages called as plain code, each inside ``stage``: the retrieval
    stages give every TIMINGS key, in the tuple's order, and each is counted once."""
    from app.service.pipeline import Pipeline

    pipeline: Any = _Pipeline()
    ctx = Context(method="vanilla")
    order: list[str] = []
    for which in (DECODE, PLAN, RUN, DEBIAS, ENCODE):
        with stage(ctx, which):
            order.append(which.name)
            if which is DECODE:
                ctx.timings["base64"] = 0.5
            if which is RUN:
                for key in ("queue", "process", "forward", "score"):
                    ctx.add(key, 1.0)
    wire = Pipeline.finish(pipeline, ctx)
    assert order == [s.name for s in RETRIEVAL_STAGES if s.inside is None]  # fetch: in decode
    assert tuple(wire) == TIMINGS  # every key, in the tuple's order, nothing else
    assert "estimate" in STAGE_KEYS and "estimate" not in TIMINGS  # admin features only
    text = pipeline.metrics.render()[0].decode()
    for key in TIMINGS:
        assert f'lad_stage_duration_seconds_count{{method="vanilla",stage="{key}"}} 1.0' in text
    with pytest.raises(AssertionError):
        Context().add("total", 1.0)  # not a stage key
    failed = Context()
    with pytest.raises(RuntimeError), stage(failed, DECODE):
        raise RuntimeError("a stage that raises is not recorded")
    assert failed.timings == {}


def test_a_stage_run_inside_another_is_reported_apart_from_it() -> None:
    from app.service.pipeline import Pipeline

    pipeline: Any = _Pipeline()

    async def decode_with_a_fetch(ctx: Context) -> None:
        with stage(ctx, DECODE), stage(ctx, FETCH):  # as the features do for URLs
            await asyncio.sleep(0.05)

    ctx = Context(method="vanilla")
    asyncio.run(decode_with_a_fetch(ctx))
    wire = Pipeline.finish(pipeline, ctx)
    assert wire["fetch"] >= 50 and wire["decode"] < 25  # the fetch is not decode's time
    plain = Context(method="vanilla")
    with stage(plain, DECODE):
        pass
    assert Pipeline.finish(pipeline, plain)["fetch"] == 0.0  # nothing to fetch: present, at 0


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


def test_an_agd_retrieve_resolves_its_labels_once(
    service: Service, items: list[RetrievalExample], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The labels are resolved (and their token trie built or looked up) once per request,
    in decode; every later stage reads the resolved ``Labels`` it was handed."""
    import app.engine.labels as labels_module
    import app.engine.runner as runner_module

    handlers, item = service.handlers, items[0]
    images = [b64(img) for img in item.images]
    body = calibration_body(make_items(5, n_candidates=3, seed="calibration", image_size=56))
    asyncio.run(handlers.calibrate(CalibrateRequest.model_validate(body)))
    calls: list[str] = []

    def counted(name: str, function: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return function(*args, **kwargs)

        return wrapper

    for module in (labels_module, runner_module):
        monkeypatch.setattr(
            module, "resolve_labels", counted("resolve", labels_module.resolve_labels)
        )
    runner = service.pipeline.runner
    monkeypatch.setattr(runner, "label_trie", counted("trie", runner.label_trie))
    answer = asyncio.run(handlers.retrieve(RetrieveOptions(method="agd"), item.query, images))
    assert answer.debiased and answer.method == "agd"
    assert calls == ["resolve", "trie"], calls
