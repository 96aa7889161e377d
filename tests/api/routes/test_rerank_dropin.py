"""POST /v1/rerank (and /v2/rerank, /rerank) in the shapes of common rerank APIs (Cohere,
Jina, vLLM): `model`, documents as strings or image objects, `return_documents`, the `id` /
`model` / `usage` answer; no remote fetch; a relevance score consistent across windows;
GET /v1/models."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np
import pytest

from lad_client import AsyncLadClient, LadClient, LadError
from lad_lab.demo.world import RetrievalExample, make_items
from tests.api.helpers import b64, data_url, multipart_files


@pytest.fixture
def calibrated(client: Any, calibrate_json: dict[str, Any]) -> Any:
    """The app with profile "default" calibrated for N = 3 (agd, the default method)."""
    r = client.post("/v1/calibrate", json=calibrate_json)
    assert r.status_code == 200, r.text
    return client


def served(client: Any) -> str:
    return client.get("/v1/models").json()["data"][0]["id"]


def check_answer(out: dict[str, Any], model: str, n: int, top_n: int) -> None:
    assert out["id"].startswith("rerank-") and len(out["id"]) > len("rerank-")
    assert out["model"] == model == out["meta"]["model"]
    usage = out["usage"]
    assert usage["images"] == n and usage["forward_passes"] == out["meta"]["forward_passes"] >= 1
    assert isinstance(usage["prompt_tokens"], int) and usage["prompt_tokens"] > 0
    assert len(out["results"]) == top_n
    scores = [x["relevance_score"] for x in out["results"]]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)


def test_models_lists_the_served_model(client: Any, runner: Any) -> None:
    r = client.get("/v1/models")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and len(body["data"]) == 1
    card = body["data"][0]
    assert card["id"] == runner.model_id and card["object"] == "model"
    assert card["owned_by"] == "lad" and isinstance(card["created"], int) and card["created"] > 0


def test_cohere_shape(calibrated: Any, items: list[RetrievalExample]) -> None:
    item, model = items[0], served(calibrated)
    docs = [b64(im) for im in item.images]
    body = {
        "model": model,
        "query": item.query,
        "documents": docs,
        "top_n": 2,
        "return_documents": True,
    }
    r = calibrated.post("/v1/rerank", json=body, headers={"X-Request-ID": "abc123"})
    assert r.status_code == 200, r.text
    out = r.json()
    check_answer(out, model, 3, 2)
    assert out["id"] == "rerank-abc123" and out["meta"]["method"] == "agd"
    for x in out["results"]:
        assert x["document"] == {"text": docs[x["index"]]}  # a string echoes as Cohere's
    again = {**body, "return_documents": False, "seed": out["meta"]["seed"]}
    plain = calibrated.post("/v1/rerank", json=again).json()
    assert all("document" not in x for x in plain["results"])  # absent, not null
    assert [x["index"] for x in plain["results"]] == [x["index"] for x in out["results"]]


@pytest.mark.parametrize("path", ["/v2/rerank", "/rerank"])
def test_every_rerank_path_answers_alike(
    calibrated: Any, items: list[RetrievalExample], path: str
) -> None:
    """Cohere v2's and vLLM's paths are POST /v1/rerank; Cohere's object documents
    ({"text": ...}) and its ignored truncation fields are accepted."""
    item, model = items[3], served(calibrated)
    docs = [b64(im) for im in item.images]
    body = {"model": model, "query": item.query, "documents": docs, "top_n": 3, "seed": 5}
    reference = calibrated.post("/v1/rerank", json=body).json()
    objects = [{"text": d} for d in docs]
    extra = {"max_tokens_per_doc": 4096, "max_chunks_per_doc": 10, "return_documents": True}
    r = calibrated.post(path, json={**body, "documents": objects, **extra})
    assert r.status_code == 200, r.text
    out = r.json()
    check_answer(out, model, 3, 3)
    assert [x["index"] for x in out["results"]] == [x["index"] for x in reference["results"]]
    assert np.allclose(
        [x["relevance_score"] for x in out["results"]],
        [x["relevance_score"] for x in reference["results"]],
    )
    assert all(x["document"] == objects[x["index"]] for x in out["results"])
    wrong = calibrated.post(path, json={**body, "model": "rerank-v3.5"})
    assert wrong.status_code == 404 and wrong.json()["error"]["code"] == "model_not_found"


def test_jina_shape(calibrated: Any, items: list[RetrievalExample]) -> None:
    item, model = items[1], served(calibrated)
    docs = [{"image": data_url(im, "PNG")} for im in item.images]
    body = {
        "model": model,
        "query": item.query,
        "documents": docs,
        "top_n": 3,
        "return_documents": True,
        "seed": 8,
    }
    r = calibrated.post("/v1/rerank", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    check_answer(out, model, 3, 3)
    assert sorted(x["index"] for x in out["results"]) == [0, 1, 2]
    for x in out["results"]:
        assert x["document"] == docs[x["index"]]
    as_strings = calibrated.post(
        "/v1/rerank", json={**body, "documents": [d["image"] for d in docs]}
    ).json()
    assert [x["index"] for x in as_strings["results"]] == [x["index"] for x in out["results"]]
    assert np.allclose(
        [x["relevance_score"] for x in as_strings["results"]],
        [x["relevance_score"] for x in out["results"]],
    )


def test_vllm_shapes(calibrated: Any, items: list[RetrievalExample]) -> None:
    item, model = items[2], served(calibrated)
    parts = [{"type": "image_url", "image_url": {"url": data_url(im, "PNG")}} for im in item.images]
    shapes = {
        "content": {"content": parts},  # ScoreMultiModalParam: one document per part
        "documents": [{"content": [part]} for part in parts],
        "parts": parts,
    }
    answers = {}
    for name, docs in shapes.items():
        body = {
            "model": model,
            "query": item.query,
            "documents": docs,
            "top_n": 3,
            "return_documents": True,
            "seed": 8,
        }
        r = calibrated.post("/v1/rerank", json=body)
        assert r.status_code == 200, (name, r.text)
        out = r.json()
        check_answer(out, model, 3, 3)
        sent = docs["content"] if name == "content" else docs
        for x in out["results"]:
            assert x["document"] == sent[x["index"]], name
        answers[name] = [x["index"] for x in out["results"]]
    assert len({tuple(a) for a in answers.values()}) == 1  # the same images, the same ranking
    text = {"type": "text", "text": "a caption"}
    r = calibrated.post("/v1/rerank", json={"query": item.query, "documents": [text, *parts]})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"


def test_wrong_model_is_404(client: Any, items: list[RetrievalExample]) -> None:
    body = {
        "model": "someone/else",
        "query": items[0].query,
        "method": "vanilla",
        "documents": [b64(im) for im in items[0].images],
    }
    r = client.post("/v1/rerank", json=body)
    assert r.status_code == 404, r.text
    error = r.json()["error"]
    assert error["code"] == "model_not_found" and served(client) in error["message"]
    assert set(r.json()) == {"error", "message", "detail"} and error["request_id"]
    fields = {"query": items[0].query, "method": "vanilla", "model": "someone/else"}
    files = [("documents", f[1]) for f in multipart_files(items[0].images)]
    r = client.post("/v1/rerank", data=fields, files=files)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = client.post(
        "/v1/rerank",
        data={**fields, "model": served(client), "return_documents": "true"},
        files=files,
    )
    assert r.status_code == 200, r.text
    assert r.json()["model"] == served(client) and r.json()["usage"]["images"] == 3
    for x in r.json()["results"]:  # a file part is echoed as its bytes in base64
        assert base64.b64decode(x["document"]["text"]) == files[x["index"]][1][1]


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data",
        "https://example.com/cat.png",
        "file:///etc/passwd",
    ],
)
def test_remote_urls_are_not_fetched(client: Any, items: list[RetrievalExample], url: str) -> None:
    """By default (LAD_MEDIA_ALLOWED_DOMAINS empty) no URL is fetched, in any shape;
    tests/api/routes/test_media_urls.py has the URLs an operator allows."""
    docs = [b64(im) for im in items[0].images]
    why = "never fetched" if url.startswith("file:") else "LAD_MEDIA_ALLOWED_DOMAINS is empty"
    for shaped in (url, {"image": url}, {"type": "image_url", "image_url": {"url": url}}):
        body = {"query": items[0].query, "method": "vanilla", "documents": [*docs, shaped]}
        r = client.post("/v1/rerank", json=body)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == "media_not_allowed" and why in error["message"]
    r = client.post(
        "/v1/retrieve",
        json={"query": items[0].query, "method": "vanilla", "images": [*docs[:2], url]},
    )
    assert r.status_code == 400 and why in r.json()["error"]["message"]


def test_relevance_score_follows_the_ranking_across_windows(client: Any) -> None:
    many = make_items(1, n_candidates=10, setting="random", seed="eval", image_size=56)[0]
    body = {
        "query": many.query,
        "documents": [b64(im) for im in many.images],
        "method": "vanilla",
        "window": 4,
        "seed": 3,
    }
    out = client.post("/v1/rerank", json=body).json()
    assert out["meta"]["rounds"] == 2 and len(out["results"]) == 10
    scores = [x["relevance_score"] for x in out["results"]]
    assert scores == sorted(scores, reverse=True)
    finalists = out["meta"]["windows"][-1][0]  # the final window's scores are in [1/2, 1]
    assert all(s >= 0.5 for s in scores[:finalists]) and all(s <= 0.5 for s in scores[finalists:])
    assert np.isclose(sum(scores[:finalists]), (finalists * 1 + 1) / 2)  # (1 + p) / 2, sum p = 1


def test_clients_send_model_and_return_documents(
    live_server: Any, items: list[RetrievalExample]
) -> None:
    server = live_server()
    query, images = items[0].query, items[0].images
    with LadClient(server.url) as lad:
        model = lad.models().data[0].id
        out = lad.rerank(
            query, images, method="vanilla", model=model, return_documents=True, top_n=2
        )
        assert out.model == model and len(out.results) == 2 and out.usage.images == 3
        assert all(isinstance(x.document, dict) and x.document["text"] for x in out.results)
        assert lad.rerank(query, images, method="vanilla").results[0].document is None
        with pytest.raises(LadError) as refused:
            lad.rerank(query, images, method="vanilla", model="someone/else")
        assert refused.value.code == "model_not_found"

    async def go() -> Any:
        async with AsyncLadClient(server.url) as alad:
            listed = await alad.models()
            ranked = await alad.rerank(
                query,
                images,
                method="vanilla",
                seed=1,
                model=listed.data[0].id,
                return_documents=True,
            )
            return listed, ranked

    listed, ranked = asyncio.run(go())
    assert listed.data[0].id == model and len(ranked.results) == 3
    assert all(x.document for x in ranked.results)
