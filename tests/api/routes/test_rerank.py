"""POST /v1/rerank: shapes, top_n, the tournament's cost and determinism, profiles per window
size, multipart, limits and 4xx (on the tiny Qwen2.5-VL runner)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from app.method.tournament import window_sizes
from lad_lab.demo.world import RetrievalExample, make_items
from tests.api.helpers import b64, calibration_body, multipart_files, retrieve_body


@pytest.fixture(scope="module")
def many() -> RetrievalExample:
    return make_items(1, n_candidates=10, setting="random", seed="eval", image_size=56)[0]


def body(item: RetrievalExample, **extra: Any) -> dict[str, Any]:
    return {"query": item.query, "documents": [b64(img) for img in item.images], **extra}


def test_tournament_shape_cost_and_determinism(client: Any, many: RetrievalExample) -> None:
    r = client.post("/v1/rerank", json=body(many, method="vanilla", window=4, top_n=3, seed=11))
    assert r.status_code == 200, r.text
    out = r.json()
    indices = [x["index"] for x in out["results"]]
    assert len(indices) == 3 == len(set(indices)) and all(0 <= i < 10 for i in indices)
    meta = out["meta"]
    assert meta["windows"] == window_sizes(10, 4, 3) == [[4, 3, 3], [4, 3], [3, 2], [3]]
    assert meta["rounds"] == 4 and meta["seed"] == 11 and meta["window"] == 4
    assert meta["forward_passes"] == sum(len(r) for r in meta["windows"])  # 1 pass per window
    assert meta["profile"] is None and meta["method"] == "vanilla"
    again = client.post(
        "/v1/rerank", json=body(many, method="vanilla", window=4, top_n=3, seed=11)
    ).json()
    assert again["results"] == out["results"]
    full = client.post("/v1/rerank", json=body(many, method="vanilla", window=4, seed=11)).json()
    assert sorted(x["index"] for x in full["results"]) == list(range(10))  # top_n unset: all
    assert full["meta"]["windows"] == [[4, 3, 3], [3]]  # ... but only winners advance
    fresh = client.post("/v1/rerank", json=body(many, method="vanilla")).json()["meta"]
    assert fresh["window"] == 10 and fresh["rounds"] == 1  # default window: LAD_MAX_IMAGES


def test_perm_avg_costs_n_per_window_and_one_window_equals_retrieve(
    client: Any, many: RetrievalExample, items: list[RetrievalExample]
) -> None:
    out = client.post("/v1/rerank", json=body(many, method="perm_avg", window=5, seed=2)).json()
    assert out["meta"]["windows"] == [[5, 5], [2]]
    assert out["meta"]["forward_passes"] == 5 + 5 + 2
    item = items[0]  # 3 documents, one window: perm_avg is order-free, so it is retrieval's
    ranked = client.post("/v1/rerank", json=body(item, method="perm_avg", seed=5)).json()
    answer = client.post("/v1/retrieve", json=retrieve_body(item, method="perm_avg")).json()
    assert [x["index"] for x in ranked["results"]] == answer["ranking"]
    assert np.allclose(
        [x["relevance_score"] for x in ranked["results"]],
        sorted(answer["probabilities"], reverse=True),
        atol=1e-9,
    )


def test_agd_uses_the_profile_of_each_window_size(client: Any, many: RetrievalExample) -> None:
    r = client.post("/v1/rerank", json=body(many, window=5))
    assert r.status_code == 409 and r.json()["error"]["code"] == "calibration_required"
    assert '"n": "all"' in r.json()["error"]["message"]
    wide = make_items(2, n_candidates=5, setting="random", seed="calibration", image_size=56)
    cal = client.post("/v1/calibrate", json=calibration_body(wide, n=[2, 4, 5]))
    assert cal.status_code == 200, cal.text
    r = client.post("/v1/rerank", json=body(many, seed=4, top_n=2))
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["meta"]["window"] == 5  # default: the largest calibrated N
    assert out["meta"]["windows"] == [[5, 5], [4]]
    assert out["meta"]["profile"] == {"4": 1, "5": 1} and out["meta"]["method"] == "agd"
    assert len(out["results"]) == 2
    r = client.post("/v1/rerank", json=body(many, window=4))  # windows of 3: not calibrated
    assert r.status_code == 409 and "N = [3]" in r.json()["error"]["message"]


def test_methods_without_a_profile_ignore_the_profiles_window(
    client: Any, many: RetrievalExample
) -> None:
    """vanilla, attn_raw and perm_avg default to windows of LAD_MAX_IMAGES, with or without
    an agd profile for a smaller N (docs/api.md, docs/calibration.md)."""
    six = {**body(many, seed=3), "documents": body(many)["documents"][:6]}

    def windows() -> dict[str, list[list[int]]]:
        found = {}
        for method in ("vanilla", "attn_raw", "perm_avg"):
            r = client.post("/v1/rerank", json={**six, "method": method})
            assert r.status_code == 200, (method, r.text)
            found[method] = r.json()["meta"]["windows"]
        return found

    before = windows()
    assert before == {"vanilla": [[6]], "attn_raw": [[6]], "perm_avg": [[6]]}
    small = make_items(2, n_candidates=3, setting="random", seed="calibration", image_size=56)
    assert client.post("/v1/calibrate", json=calibration_body(small, n=[2, 3])).status_code == 200
    assert windows() == before
    agd = client.post("/v1/rerank", json=six).json()["meta"]  # agd: the largest calibrated N
    assert agd["window"] == 3 and agd["windows"] == [[3, 3], [2]]


def test_multipart_equals_json(client: Any, many: RetrievalExample) -> None:
    fields = {"query": many.query, "method": "vanilla", "window": "4", "seed": "9", "top_n": "2"}
    files = [("documents", f[1]) for f in multipart_files(many.images)]
    r = client.post("/v1/rerank", data=fields, files=files)
    assert r.status_code == 200, r.text
    json_out = client.post(
        "/v1/rerank", json=body(many, method="vanilla", window=4, seed=9, top_n=2)
    ).json()
    assert r.json()["results"] == json_out["results"]


def test_bad_input_is_4xx(make_client: Any, many: RetrievalExample) -> None:
    client = make_client(max_rerank_candidates=8)
    cases = [
        (body(many, method="vanilla"), 422, "too_many_images"),
        ({**body(many), "documents": []}, 422, "invalid_request"),
        ({**body(many, top_n=0), "documents": body(many)["documents"][:4]}, 422, "invalid_request"),
        (
            {**body(many, window=1), "documents": body(many)["documents"][:4]},
            422,
            "invalid_request",
        ),
        (
            {**body(many, labels=["a", "b"]), "documents": body(many)["documents"][:2]},
            422,
            "invalid_request",
        ),
        (
            {**body(many, method="vanilla"), "documents": ["bm90IGFuIGltYWdl"] * 3},
            400,
            "invalid_image",
        ),
        (
            {**body(many, method="vanilla", window=20), "documents": body(many)["documents"][:4]},
            200,
            None,
        ),
        (
            {
                **body(many, method="vanilla"),
                "query": " ",
                "documents": body(many)["documents"][:4],
            },
            422,
            "invalid_query",
        ),
        ({**body(many), "raw_scores": [1]}, 422, "invalid_request"),  # a known field, mistyped
    ]
    for payload, status, code in cases:
        r = client.post("/v1/rerank", json=payload)
        assert r.status_code == status, (payload.keys(), r.text)
        if code:
            assert r.json()["error"]["code"] == code, r.text
    r = client.post(
        "/v1/rerank",
        json={
            **body(many, method="perm_avg", window=2, top_n=1),
            "documents": body(many)["documents"][:8],
        },
    )
    assert r.status_code == 200 and r.json()["meta"]["forward_passes"] == 7 * 2
    capped = make_client(max_rerank_passes=13)
    r = capped.post(
        "/v1/rerank",
        json={
            **body(many, method="perm_avg", window=2, top_n=1),
            "documents": body(many)["documents"][:8],
        },
    )
    assert r.status_code == 422 and "LAD_MAX_RERANK_PASSES=13" in r.text
    r = client.post("/v1/rerank", content=b"x", headers={"content-type": "text/plain"})
    assert r.status_code == 415
    big = make_client(max_rerank_candidates=8, max_images=4)
    r = big.post(
        "/v1/rerank",
        json={**body(many, method="vanilla", window=6), "documents": body(many)["documents"][:6]},
    )
    assert r.status_code == 422 and r.json()["error"]["code"] == "too_many_images"


class RecordingRunner:
    """The real runner, recording how many instances each forward call carried."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.batches: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def forward(self, items: Any, labels: Any = "digits") -> Any:
        self.batches.append(len(items))
        return self.inner.forward(items, labels=labels)


def test_windows_of_a_round_share_one_batch(
    make_client: Any, runner: Any, many: RetrievalExample
) -> None:
    recording = RecordingRunner(runner)
    client = make_client(runner_override=recording, max_batch_size=8, max_wait_ms=50)
    out = client.post("/v1/rerank", json=body(many, method="vanilla", window=4, seed=1)).json()
    assert out["meta"]["windows"] == [[4, 3, 3], [3]]
    assert recording.batches == [3, 1]  # round 1: its three windows in one forward
    recording.batches.clear()
    out = client.post("/v1/rerank", json=body(many, method="perm_avg", window=4, seed=1)).json()
    assert out["meta"]["forward_passes"] == 4 + 3 + 3 + 3 == sum(recording.batches)
    assert recording.batches[0] == 8  # the rotations of round 1's windows fill whole batches


def test_uncalibrated_falls_back_to_vanilla_when_configured(
    make_client: Any, many: RetrievalExample
) -> None:
    client = make_client(fallback_to_vanilla=True)
    out = client.post("/v1/rerank", json=body(many, window=4, seed=2)).json()
    assert out["meta"]["method"] == "vanilla" and out["meta"]["profile"] is None
