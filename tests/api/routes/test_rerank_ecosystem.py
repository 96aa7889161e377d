"""What the stock retrieval components need from the rerank routes (issue 39), each change on
its own: top_n clipped, one document answered without a forward pass, other APIs' fields
accepted, ignored, counted and logged (while retrieve and calibrate stay strict), documents
echoed in the caller's shape or left out, usage and billed units, the error body's fields,
and the message that names LlamaIndex's fix. The components themselves run against a live
service in tests/e2e/test_ecosystem.py."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest

from lad_client.vocabulary import IGNORED_RERANK_FIELDS
from lad_lab.demo.world import RetrievalExample
from tests.api.helpers import b64, data_url, multipart_files, retrieve_body

PATHS = ("/v1/rerank", "/v2/rerank", "/rerank")


def rerank_body(item: RetrievalExample, **extra: Any) -> dict[str, Any]:
    documents = [data_url(im, "PNG") for im in item.images]
    return {"query": item.query, "documents": documents, "method": "vanilla", **extra}


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of the /metrics text (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} ") or (not labels and line.startswith(name + " ")):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("path", PATHS)
def test_top_n_larger_than_the_documents_is_clipped(
    client: Any, items: list[RetrievalExample], path: str
) -> None:
    """As vLLM does: Haystack's default top_k=10 and LangChain's top_n=3 with 2 documents."""
    r = client.post(path, json=rerank_body(items[0], top_n=10, seed=3))
    assert r.status_code == 200, r.text
    out = r.json()
    assert sorted(x["index"] for x in out["results"]) == [0, 1, 2]
    two = {**rerank_body(items[0], top_n=3), "documents": rerank_body(items[0])["documents"][:2]}
    assert len(client.post(path, json=two).json()["results"]) == 2
    assert client.post(path, json=rerank_body(items[0], top_n=0)).status_code == 422


def test_one_document_is_answered_without_a_forward_pass(
    client: Any, items: list[RetrievalExample]
) -> None:
    """The only candidate ranks first with relevance 1.0 (any method's probability of the
    only label), whatever the method: agd needs no profile for it. Its image is still
    decoded, so a bad one is refused as any other."""
    batches = metric(client.get("/metrics").text, "lad_batch_size_count")
    for method in ("agd", "vanilla", "perm_avg"):
        body = {**rerank_body(items[0], method=method), "documents": [b64(items[0].images[1])]}
        r = client.post("/v1/rerank", json={**body, "top_n": 5, "return_documents": True})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["results"] == [
            {"index": 0, "relevance_score": 1.0, "document": {"text": body["documents"][0]}}
        ]
        assert out["usage"] == {
            "images": 1,
            "prompt_tokens": 0,
            "total_tokens": 0,
            "forward_passes": 0,
        }
        meta = out["meta"]
        assert meta["method"] == method and meta["profile"] is None and meta["rounds"] == 0
        assert meta["windows"] == [] and meta["forward_passes"] == 0 and meta["window"] == 1
    assert metric(client.get("/metrics").text, "lad_batch_size_count") == batches  # no forward
    bad = {**rerank_body(items[0]), "documents": ["bm90IGFuIGltYWdl"]}
    r = client.post("/v1/rerank", json=bad)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_image"
    empty = client.post("/v1/rerank", json={**rerank_body(items[0]), "documents": []})
    assert empty.status_code == 422 and empty.json()["error"]["code"] == "invalid_request"
    files = [("documents", f[1]) for f in multipart_files(items[0].images[:1])]
    form = client.post("/v1/rerank", data={"query": items[0].query}, files=files)
    assert form.status_code == 200 and form.json()["results"][0]["relevance_score"] == 1.0
    # /v1/retrieve asks which of N >= 2 images matches: one image stays refused there
    one = {"query": items[0].query, "images": [b64(items[0].images[0])], "method": "vanilla"}
    r = client.post("/v1/retrieve", json=one)
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
    r = client.post(
        "/v1/retrieve", data={"query": items[0].query}, files=multipart_files(items[0].images[:1])
    )
    assert r.status_code == 422 and r.json()["error"]["code"] == "too_few_images"


def test_other_apis_fields_are_accepted_ignored_counted_and_logged(
    client: Any, items: list[RetrievalExample], caplog: pytest.LogCaptureFixture
) -> None:
    body = rerank_body(items[0], seed=4)
    reference = client.post("/v1/rerank", json=body).json()
    invented = "x\u202e\ninjected=1"  # a bidirectional override and a line break
    sent = {
        **body,
        "raw_scores": False,  # Infinity's client, always
        "max_tokens_per_doc": 4096,  # Haystack's CohereRanker, always
        "truncate_prompt_tokens": 512,  # vLLM
        "rank_fields": ["text"],  # Cohere v1
        invented: 1,
        "user": "someone",
    }
    with caplog.at_level(logging.INFO, logger="lad.request"):
        caplog.clear()
        r = client.post("/v2/rerank", json=sent)
    assert r.status_code == 200, r.text
    assert [x["index"] for x in r.json()["results"]] == [
        x["index"] for x in reference["results"]
    ]  # ignored: the same ranking
    text = client.get("/metrics").text
    for field in ("raw_scores", "max_tokens_per_doc", "truncate_prompt_tokens", "rank_fields"):
        assert metric(text, "lad_rerank_ignored_fields_total", field=field) == 1, field
    assert metric(text, "lad_rerank_ignored_fields_total", field="user") == 1
    assert metric(text, "lad_rerank_ignored_fields_total", field="other") == 1
    assert metric(text, "lad_rerank_ignored_fields_total", field="softmax") == 0  # created at 0
    assert f'field="{invented}"' not in text and "injected" not in text
    series = re.findall(r"^lad_rerank_ignored_fields_total\{", text, re.M)
    assert len(series) == len(IGNORED_RERANK_FIELDS) + 1  # a fixed set of label values

    (line,) = [r for r in caplog.records if r.name == "lad.request"]
    logged = line.lad["ignored_fields"]
    assert "'raw_scores'" in logged and "'max_tokens_per_doc'" in logged
    assert "\\u202e" in logged and "\\n" in logged  # escaped, never raw
    assert "\u202e" not in logged and "\n" not in logged

    many = {**body, **{f"field_{k}": k for k in range(40)}}
    with caplog.at_level(logging.INFO, logger="lad.request"):
        caplog.clear()
        assert client.post("/rerank", json=many).status_code == 200
    (line,) = [r for r in caplog.records if r.name == "lad.request"]
    assert line.lad["ignored_fields"].endswith("(and 24 more)")
    text = client.get("/metrics").text
    assert metric(text, "lad_rerank_ignored_fields_total", field="other") == 41
    with caplog.at_level(logging.INFO, logger="lad.request"):
        caplog.clear()
        client.post("/v1/rerank", json=body)
    (line,) = [r for r in caplog.records if r.name == "lad.request"]
    assert "ignored_fields" not in line.lad  # a request without such fields names none


def test_retrieve_calibrate_and_the_rerank_form_stay_strict(
    client: Any, items: list[RetrievalExample], calibrate_json: dict[str, Any]
) -> None:
    """Where the request is ours, an unknown field is a mistake worth a 422."""
    r = client.post("/v1/retrieve", json=retrieve_body(items[0], method="vanilla", extra=1))
    assert r.status_code == 422 and "extra" in r.json()["error"]["message"]
    r = client.post("/v1/calibrate", json={**calibrate_json, "raw_scores": False})
    assert r.status_code == 422 and "raw_scores" in r.json()["error"]["message"]
    files = [("documents", f[1]) for f in multipart_files(items[0].images)]
    r = client.post("/v1/rerank", data={"query": items[0].query, "raw_scores": "0"}, files=files)
    assert r.status_code == 422 and "raw_scores" in r.json()["error"]["message"]
    nested = {**rerank_body(items[0])}
    nested["documents"] = [{"image": d, "caption": "x"} for d in nested["documents"]]
    assert client.post("/v1/rerank", json=nested).status_code == 422  # documents stay exact


def test_documents_echo_in_the_callers_shape(client: Any, items: list[RetrievalExample]) -> None:
    urls = [data_url(im, "PNG") for im in items[0].images]
    shapes: list[Any] = [
        urls[0],
        {"image": urls[1]},
        {"type": "image_url", "image_url": {"url": urls[2]}},
    ]
    expected = [{"text": urls[0]}, shapes[1], shapes[2]]
    body = {"query": items[0].query, "documents": shapes, "method": "vanilla"}
    out = client.post("/rerank", json={**body, "return_documents": True}).json()
    assert all(x["document"] == expected[x["index"]] for x in out["results"])
    for plain in (body, {**body, "return_documents": False}):
        out = client.post("/rerank", json=plain).json()
        assert all(set(x) == {"index", "relevance_score"} for x in out["results"])


def test_usage_and_billed_units(client: Any, items: list[RetrievalExample]) -> None:
    r = client.post("/v1/rerank", json=rerank_body(items[0], method="perm_avg"))
    assert r.status_code == 200, r.text
    out = r.json()
    usage, meta = out["usage"], out["meta"]
    assert usage["prompt_tokens"] == usage["total_tokens"] > 0
    assert usage["images"] == 3 and usage["forward_passes"] == meta["forward_passes"] == 3
    assert meta["billed_units"] == {"images": 3, "input_tokens": usage["prompt_tokens"]}


def test_error_body_carries_what_each_client_reads(
    make_client: Any, items: list[RetrievalExample]
) -> None:
    """Ours under error (code, message, type, request_id); message again at the top
    (Cohere), detail (Jina; on 422 FastAPI's list, which Infinity's client parses)."""
    client = make_client(retrieve_token="t" * 20)
    auth = {"Authorization": "Bearer " + "t" * 20}
    bad_image = {**rerank_body(items[0]), "documents": ["bm90IGFuIGltYWdl"]}
    invalid = "invalid_request_error"
    cases = [
        ({"json": bad_image, "headers": auth}, 400, "invalid_image", invalid),
        ({"json": {"query": "q"}, "headers": auth}, 422, "invalid_request", invalid),
        ({"json": rerank_body(items[0])}, 401, "unauthorized", "authentication_error"),
        (
            {"json": rerank_body(items[0]), "headers": {"Authorization": "Bearer nope"}},
            403,
            "forbidden",
            "permission_error",
        ),
        (
            {"json": rerank_body(items[0], model="rerank-v3.5"), "headers": auth},
            404,
            "model_not_found",
            "invalid_request_error",
        ),
    ]
    for path in PATHS:
        for request, status, code, kind in cases:
            r = client.post(path, **request)
            assert r.status_code == status, (path, r.text)
            body = r.json()
            error = body["error"]
            assert error["code"] == code and error["type"] == kind
            assert error["request_id"] == r.headers["x-request-id"]
            assert body["message"] == error["message"] and error["message"]
            if status == 422:
                assert body["detail"] == [{"loc": ["body"], "msg": error["message"], "type": code}]
            else:
                assert body["detail"] == error["message"]
    r = client.get("/v1/nowhere")
    assert r.status_code == 404 and r.json()["detail"] == r.json()["error"]["message"]


def test_metadata_before_the_image_names_llamaindexs_fix(
    client: Any, items: list[RetrievalExample]
) -> None:
    """LlamaIndex's rerankers send a node's metadata lines, a blank line, then its text."""
    urls = [data_url(im, "PNG") for im in items[0].images]
    llama = [f"file_name: {k}.png\nfile_path: /data/{k}.png\n\n{u}" for k, u in enumerate(urls)]
    for path in PATHS:
        r = client.post(path, json={"query": items[0].query, "documents": llama})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == "invalid_image" and error["message"].startswith("documents[0] ")
        assert "excluded_embed_metadata_keys" in error["message"]
        assert "file_name" not in error["message"]  # the client's text is not echoed
    other = [f"an image: {u}" for u in urls]
    r = client.post("/v1/rerank", json={"query": items[0].query, "documents": other})
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "holds text before its data:image" in message and "LlamaIndex" not in message
