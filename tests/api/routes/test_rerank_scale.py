"""POST /v1/rerank at the size retrieval produces: 256 documents (the default limit) and
1,000 with the limit raised, answered within the memory bound (the documents' pixels are
decoded one batch of windows at a time, never all at once), a full ranking (top_n = N) at
a bounded number of forwards, and the forwards spent in ``usage`` and ``meta``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from PIL import Image

from app.budget import BODY_COPIES, PIXEL_BYTES
from app.method.tournament import halving_bound, window_sizes
from app.settings import Settings
from lad_client.types import RerankRequest
from tests.api.helpers import b64

QUERY = "a small red circle at the top on a striped background"


def documents(count: int, side: int) -> list[str]:
    """``count`` distinct flat-colour PNGs of side x side (small bodies, real pixels)."""
    return [
        b64(Image.new("RGB", (side, side), (i % 256, (7 * i + i // 256) % 256, (13 * i) % 256)))
        for i in range(count)
    ]


class DecodeSpy:
    """Wraps the service's ``Decoder.decode``: how many images each call decoded at once."""

    def __init__(self, decoder: Any) -> None:
        self.calls: list[int] = []
        inner = decoder.decode

        def decode(encoded: Any, where: str) -> Any:
            self.calls.append(len(encoded))
            return inner(encoded, where)

        decoder.decode = decode


def post(client: Any, payload: dict[str, Any]) -> tuple[Any, int]:
    """The answer and the body's size (sent as bytes, so its budget charge is known)."""
    raw = json.dumps(payload).encode()
    r = client.post("/v1/rerank", content=raw, headers={"content-type": "application/json"})
    return r, len(raw)


def windows(rounds: list[list[int]]) -> int:
    return sum(len(r) for r in rounds)


def test_256_documents_within_the_memory_bound(make_client: Any) -> None:
    side, batch = 256, 4
    client = make_client(max_batch_size=batch)
    service = client.app.state.service
    spy = DecodeSpy(service.pipeline.decoder)
    window = service.settings.max_images  # vanilla's default window
    assert Settings(_env_file=None).max_rerank_candidates >= 256
    payload = {"query": QUERY, "documents": documents(256, side), "method": "vanilla"}
    r, body = post(client, {**payload, "top_n": 256, "seed": 3})
    assert r.status_code == 200, r.text
    out = r.json()
    assert sorted(x["index"] for x in out["results"]) == list(range(256))
    planned = window_sizes(256, window, 256)
    assert out["meta"]["windows"] == planned
    spent = windows(planned)
    assert out["usage"]["forward_passes"] == out["meta"]["forward_passes"] == spent
    assert spent <= halving_bound(256, window) <= 2 * windows(window_sizes(256, window, 1))
    # pixels: at most one batch of windows decoded at once, never the 256 documents
    assert max(spy.calls) <= batch * window < 256
    assert sum(spy.calls) == sum(sum(r) for r in planned)  # each round decodes its windows
    one_batch = batch * window * side * side * PIXEL_BYTES
    all_at_once = 256 * side * side * PIXEL_BYTES
    peak = service.budget.peak - BODY_COPIES * body
    assert 0 < peak <= one_batch < all_at_once / 4
    assert service.budget.used == 0


def test_a_full_ranking_costs_at_most_twice_a_top_1_rerank(client: Any) -> None:
    payload = {"query": QUERY, "documents": documents(64, 16), "method": "vanilla", "seed": 5}
    one, _ = post(client, payload)  # top_n unset: winners only advance, every document back
    full, _ = post(client, {**payload, "top_n": 64})
    assert one.status_code == full.status_code == 200, (one.text, full.text)
    top_1, ranked = one.json(), full.json()
    assert top_1["meta"]["forward_passes"] == 7 and top_1["meta"]["windows"] == [
        [11, 11, 11, 11, 10, 10],
        [6],
    ]
    assert ranked["meta"]["windows"] == [[11, 11, 11, 11, 10, 10], [12, 12, 12], [12, 12], [12]]
    assert ranked["usage"]["forward_passes"] == 12 <= 2 * 7  # 53 under the runners-up rule
    assert sorted(x["index"] for x in ranked["results"]) == list(range(64))
    scores = [x["relevance_score"] for x in ranked["results"]]
    assert scores == sorted(scores, reverse=True)


def test_1000_documents_with_the_limit_raised(make_client: Any) -> None:
    client = make_client(max_rerank_candidates=1000, max_batch_size=16)
    docs = documents(1000, 8)
    r, _ = post(client, {"query": QUERY, "documents": docs, "method": "vanilla", "seed": 1})
    assert r.status_code == 200, r.text
    out = r.json()
    assert len(out["results"]) == 1000 and out["usage"]["images"] == 1000
    assert out["usage"]["forward_passes"] == windows(window_sizes(1000, 12, 1)) == 92
    r, _ = post(client, {"query": QUERY, "documents": [*docs, docs[0]], "method": "vanilla"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "too_many_images"
    assert "LAD_MAX_RERANK_CANDIDATES=1000" in r.text


def test_more_than_the_default_limit_is_refused_with_its_name(client: Any) -> None:
    docs = documents(257, 4)
    r, _ = post(client, {"query": QUERY, "documents": docs, "method": "vanilla"})
    assert r.status_code == 422 and "LAD_MAX_RERANK_CANDIDATES=256" in r.text


def test_a_batch_of_windows_over_the_pixel_limit_is_refused_before_any_forward(
    make_client: Any,
) -> None:
    client = make_client(max_request_pixels=40 * 32 * 32, max_batch_size=4)
    docs = documents(64, 32)
    r, _ = post(client, {"query": QUERY, "documents": docs, "method": "vanilla", "window": 8})
    assert r.status_code == 200, r.text  # a batch: 4 windows of 8, 32 images decoded at once
    r, _ = post(client, {"query": QUERY, "documents": docs, "method": "vanilla", "window": 12})
    assert r.status_code == 413 and r.json()["error"]["code"] == "image_too_large", r.text
    assert "LAD_MAX_REQUEST_PIXELS" in r.text and "44 largest images" in r.text  # 4 x 11


@pytest.mark.parametrize("count", [65, 300])
def test_the_wire_types_leave_the_document_limit_to_the_server(count: int) -> None:
    """No client-side cap (lad_client's MAX_N is 64): the server's setting decides."""
    request = RerankRequest.model_validate(
        {"query": QUERY, "documents": ["x"] * count, "top_n": count, "window": count}
    )
    assert len(request.images()) == count


def test_a_document_corrupt_past_its_header_fails_the_request_cleanly(client: Any) -> None:
    """Headers are all checked before any forward; a body cut short after its header is
    found when its batch decodes (the first round decodes every document), answered 400
    with nothing left held."""
    import base64

    docs = documents(40, 16)
    cut = base64.b64decode(docs[30])
    docs[30] = base64.b64encode(cut[: len(cut) // 2]).decode()
    bad_header = [
        *documents(40, 16)[:39],
        base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"x" * 40).decode(),
    ]
    r, _ = post(client, {"query": QUERY, "documents": bad_header, "method": "vanilla"})
    assert r.status_code == 400 and "documents[39]" in r.text
    service = client.app.state.service
    before = service.worker.batcher.depth
    r, _ = post(client, {"query": QUERY, "documents": docs, "method": "vanilla", "window": 4})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_image", r.text
    assert "documents[30]" in r.text
    assert service.budget.used == 0 and service.worker.batcher.depth == before


def test_multipart_takes_more_than_64_documents(client: Any) -> None:
    import base64

    files = [
        ("documents", (f"{i}.png", base64.b64decode(doc), "image/png"))
        for i, doc in enumerate(documents(100, 8))
    ]
    fields = {"query": QUERY, "method": "vanilla", "top_n": "100", "seed": "2"}
    r = client.post("/v1/rerank", data=fields, files=files)
    assert r.status_code == 200, r.text
    assert sorted(x["index"] for x in r.json()["results"]) == list(range(100))


def test_a_document_decoded_again_is_not_encoded_again(
    client: Any, runner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Later rounds decode their documents afresh; the encoder cache knows them by content,
    so the vision tower sees each document once."""
    import numpy as np

    from app.engine.encoder_cache import EncoderCache

    cache = EncoderCache(64, runner.encoder_cache.fingerprint)  # the shared runner's is off
    monkeypatch.setattr(runner, "encoder_cache", cache)
    rng = np.random.default_rng(20240611)
    docs = [
        b64(Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8))) for _ in range(64)
    ]
    before = cache.snapshot()
    r, _ = post(client, {"query": QUERY, "documents": docs, "method": "vanilla", "top_n": 64})
    assert r.status_code == 200, r.text
    after = cache.snapshot()
    rounds = r.json()["meta"]["windows"]
    assert after["misses"] - before["misses"] == 64
    assert after["hits"] - before["hits"] == sum(map(sum, rounds[1:]))
