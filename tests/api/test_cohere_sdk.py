"""The real Cohere SDK against a running service: ``cohere.Client`` posts to /v1/rerank,
``cohere.ClientV2`` (and its async twin) to /v2/rerank, each with its bearer token, and both
get the ranking POST /v1/rerank answers for the same request."""

from __future__ import annotations

import asyncio
from typing import Any

import cohere
import httpx
import pytest
from cohere.core.api_error import ApiError

from lad_lab.demo.world import RetrievalExample
from tests.api.helpers import data_url, png_bytes
from tests.media_server import MediaServer

TOKEN = "cohere-test-token"
SEED = {"additional_body_parameters": {"seed": 11}}
"""Pins the window assignment (a service field the SDK passes through as it is)."""


@pytest.fixture
def server(live_server: Any, calibrate_json: dict[str, Any]) -> Any:
    """A live service with a retrieve token and profile "default" calibrated for N = 3."""
    served = live_server(retrieve_token=TOKEN)
    answer = httpx.post(f"{served.url}/v1/calibrate", json=calibrate_json, timeout=120)
    assert answer.status_code == 200, answer.text
    return served


def reference(server: Any, body: dict[str, Any]) -> list[tuple[int, float]]:
    """POST /v1/rerank's (index, relevance_score) for ``body``."""
    answer = httpx.post(
        f"{server.url}/v1/rerank",
        json={**body, "seed": 11},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    return [(x["index"], x["relevance_score"]) for x in answer.json()["results"]]


def same(results: Any, expected: list[tuple[int, float]]) -> bool:
    """The SDK's results are ``expected``: the same indices, in order, and scores."""
    indices, scores = zip(*expected, strict=True) if expected else ((), ())
    return [x.index for x in results] == list(indices) and [
        x.relevance_score for x in results
    ] == pytest.approx(list(scores))


def test_cohere_client_v1_and_v2(server: Any, items: list[RetrievalExample]) -> None:
    item = items[0]
    documents = [data_url(im, "PNG") for im in item.images]
    model = httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]
    expected = reference(server, {"model": model, "query": item.query, "documents": documents})
    assert sorted(i for i, _ in expected) == [0, 1, 2]

    v1 = cohere.Client(api_key=TOKEN, base_url=server.url, timeout=120)
    out = v1.rerank(model=model, query=item.query, documents=documents, request_options=SEED)
    assert same(out.results, expected)
    objects = [{"text": d} for d in documents]  # Cohere's object documents
    top = v1.rerank(model=model, query=item.query, documents=objects, top_n=2, request_options=SEED)
    assert same(top.results, expected[:2])
    echoed = v1.rerank(
        model=model, query=item.query, documents=objects, return_documents=True, top_n=1
    )
    assert echoed.results[0].document.text == documents[echoed.results[0].index]

    v2 = cohere.ClientV2(api_key=TOKEN, base_url=server.url, timeout=120)
    out2 = v2.rerank(
        model=model, query=item.query, documents=documents, top_n=3, request_options=SEED
    )
    assert same(out2.results, expected)
    assert out2.id and out2.id.startswith("rerank-")
    assert all(0 <= x.relevance_score <= 1 for x in out2.results)
    unpinned = v2.rerank(model=model, query=item.query, documents=documents, top_n=1)
    assert len(unpinned.results) == 1 and unpinned.results[0].index in (0, 1, 2)

    async def go() -> Any:
        async_v2 = cohere.AsyncClientV2(api_key=TOKEN, base_url=server.url, timeout=120)
        return await async_v2.rerank(
            model=model, query=item.query, documents=documents, request_options=SEED
        )

    assert same(asyncio.run(go()).results, expected)


def test_cohere_clients_see_the_services_errors(server: Any, items: list[RetrievalExample]) -> None:
    item = items[1]
    documents = [data_url(im, "PNG") for im in item.images]
    v2 = cohere.ClientV2(api_key=TOKEN, base_url=server.url, timeout=120)
    with pytest.raises(ApiError) as wrong_model:
        v2.rerank(model="rerank-v3.5", query=item.query, documents=documents)
    assert wrong_model.value.status_code == 404
    assert wrong_model.value.body["error"]["code"] == "model_not_found"
    model = httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]
    intruder = cohere.ClientV2(api_key="not-the-token", base_url=server.url, timeout=120)
    with pytest.raises(ApiError) as refused:
        intruder.rerank(model=model, query=item.query, documents=documents)
    assert refused.value.status_code == 403
    v1 = cohere.Client(api_key=TOKEN, base_url=server.url, timeout=120)
    with pytest.raises(ApiError) as not_an_image:
        v1.rerank(model=model, query=item.query, documents=[*documents[:1], "bm90IGFuIGltYWdl"])
    assert not_an_image.value.status_code == 400
    assert "documents[1] is not a readable image" in not_an_image.value.body["message"]


def test_cohere_client_sends_image_urls_the_operator_allows(
    live_server: Any, items: list[RetrievalExample]
) -> None:
    """URL documents through the stock SDK, as a backend that keeps CDN URLs sends them:
    the same ranking as the images sent inline."""
    item = items[0]
    served = live_server(
        media_allowed_domains=["127.0.0.1"], media_allowed_networks=["127.0.0.1/32"]
    )
    client = cohere.ClientV2(api_key=TOKEN, base_url=served.url, timeout=120)
    model = httpx.get(f"{served.url}/v1/models").json()["data"][0]["id"]
    options = {"additional_body_parameters": {"seed": 11, "method": "vanilla"}}
    inline = [data_url(im, "PNG") for im in item.images]
    with MediaServer() as images:
        urls = [images.add(f"{i}.png", png_bytes(im)) for i, im in enumerate(item.images)]
        by_url = client.rerank(
            model=model, query=item.query, documents=urls, request_options=options
        )
    sent = client.rerank(model=model, query=item.query, documents=inline, request_options=options)
    assert [(x.index, x.relevance_score) for x in by_url.results] == [
        (x.index, x.relevance_score) for x in sent.results
    ]
