"""A prompt over the model's context is refused with 422 `prompt_too_long` (its token count
and the limit in the message) before any forward, on retrieve, rerank and calibrate."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from app.engine.interface import RetrievalItem
from lad_lab.demo.world import RetrievalExample
from tests.api.helpers import b64, retrieve_body

torch.set_num_threads(1)


@pytest.fixture
def forwards(runner: Any) -> Any:
    """Counts the model's forward calls while the test runs."""
    calls: list[int] = []
    handle = runner.model.register_forward_pre_hook(lambda *_: calls.append(1))
    yield calls
    handle.remove()


def _prompt_tokens(runner: Any, item: RetrievalExample) -> int:
    batch = runner.process([RetrievalItem(item.query, item.images)])
    return int(batch.attention_mask.sum())


def test_over_the_context_is_422_before_any_forward(
    client: Any,
    runner: Any,
    items: list[RetrievalExample],
    forwards: list[int],
    monkeypatch: pytest.MonkeyPatch,
    calibrate_json: dict[str, Any],
) -> None:
    item = items[0]
    tokens = _prompt_tokens(runner, item)  # N = 3 digit labels: one label token each
    text_config = runner.adapter.text_config()
    assert runner.adapter.context_length() == text_config.max_position_embeddings == 4096
    monkeypatch.setattr(text_config, "max_position_embeddings", tokens + 1)  # exactly fits
    ok = client.post("/v1/retrieve", json=retrieve_body(item, method="vanilla"))
    assert ok.status_code == 200, ok.text
    forwards.clear()

    monkeypatch.setattr(text_config, "max_position_embeddings", tokens)  # one token short
    r = client.post("/v1/retrieve", json=retrieve_body(item, method="vanilla"))
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "prompt_too_long"
    assert f"the prompt is {tokens} tokens" in error["message"]
    assert f"context of {tokens} tokens" in error["message"]
    documents = {"query": item.query, "documents": [b64(img) for img in item.images]}
    rerank = client.post("/v1/rerank", json={**documents, "method": "vanilla"})
    assert rerank.status_code == 422 and rerank.json()["error"]["code"] == "prompt_too_long"
    calibrate = client.post("/v1/calibrate", json=calibrate_json)
    assert calibrate.status_code == 422, calibrate.text
    assert calibrate.json()["error"]["code"] == "prompt_too_long"
    assert forwards == [], "a refused prompt must cost no forward pass"


def test_a_too_long_request_does_not_fail_the_others_in_its_batch(
    make_client: Any,
    runner: Any,
    items: list[RetrievalExample],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import concurrent.futures

    short, long = items[0], make_many(items)
    limit = _prompt_tokens(runner, short) + 1
    assert _prompt_tokens(runner, long) + 1 > limit
    monkeypatch.setattr(runner.adapter.text_config(), "max_position_embeddings", limit)
    client = make_client(max_wait_ms=200)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        a = pool.submit(client.post, "/v1/retrieve", json=retrieve_body(short, method="vanilla"))
        b = pool.submit(client.post, "/v1/retrieve", json=retrieve_body(long, method="vanilla"))
        assert a.result().status_code == 200
        assert b.result().status_code == 422
        assert b.result().json()["error"]["code"] == "prompt_too_long"


def make_many(items: list[RetrievalExample]) -> RetrievalExample:
    """An item with the images of two: a longer prompt than either."""
    return dataclasses.replace(items[0], images=[*items[0].images, *items[1].images])


def test_openapi_lists_prompt_too_long_for_the_model_routes(client: Any) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/v1/retrieve", "/v1/rerank", "/v1/calibrate"):
        assert "`prompt_too_long`" in paths[path]["post"]["responses"]["422"]["description"]
