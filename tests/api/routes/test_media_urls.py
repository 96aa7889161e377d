"""Images by URL through the routes: fetched only from hosts the operator allows, the same
answer as the images sent inline, every refusal a 4xx of its own, the fetch timed as its
own stage, and a rerank of 256 documents by URL within the replica's byte budget.

The image host is tests/media_server.py on 127.0.0.1: a loopback address, so each test
that fetches allows both the host (LAD_MEDIA_ALLOWED_DOMAINS) and its network
(LAD_MEDIA_ALLOWED_NETWORKS) explicitly."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from PIL import Image

from app.budget import PIXEL_BYTES
from app.method.tournament import window_sizes
from app.service.decode.media import RESERVE_STEP
from lad_lab.demo.world import RetrievalExample
from tests.api.helpers import b64, metric_value, png_bytes
from tests.media_server import MediaServer

ALLOW = {"media_allowed_domains": ["127.0.0.1"], "media_allowed_networks": ["127.0.0.1/32"]}


@pytest.fixture
def server() -> Iterator[MediaServer]:
    with MediaServer() as running:
        yield running


def serve_images(server: MediaServer, images: list[Image.Image], prefix: str) -> list[str]:
    return [server.add(f"{prefix}{i}.png", png_bytes(im)) for i, im in enumerate(images)]


def error_of(r: Any, status: int, code: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()["error"]
    assert body["code"] == code, body
    return str(body["message"])


def test_retrieve_by_url_answers_as_the_images_sent_inline(
    make_client: Any, server: MediaServer, items: list[RetrievalExample]
) -> None:
    client, item = make_client(**ALLOW), items[0]
    urls = serve_images(server, item.images, "r")
    inline = client.post(
        "/v1/retrieve",
        json={"query": item.query, "method": "vanilla", "images": [b64(im) for im in item.images]},
    )
    by_url = client.post(
        "/v1/retrieve", json={"query": item.query, "method": "vanilla", "images": urls}
    )
    assert inline.status_code == by_url.status_code == 200, by_url.text
    assert by_url.json()["probabilities"] == inline.json()["probabilities"]
    assert by_url.json()["timings_ms"]["fetch"] > 0 and inline.json()["timings_ms"]["fetch"] == 0
    assert client.app.state.service.budget.used == 0  # the fetched bytes left with the request
    text = client.get("/metrics").text
    assert metric_value(text, "lad_media_fetches_total", outcome="ok") == 3
    assert metric_value(text, "lad_media_fetched_bytes_total") == sum(
        len(png_bytes(im)) for im in item.images
    )
    assert 'lad_stage_duration_seconds_count{method="vanilla",stage="fetch"} 2.0' in text


def test_rerank_and_calibrate_take_urls_in_every_shape(
    make_client: Any,
    server: MediaServer,
    items: list[RetrievalExample],
    calibration_items: list[RetrievalExample],
) -> None:
    client, item = make_client(**ALLOW), items[1]
    urls = serve_images(server, item.images, "k")
    shapes = [urls[0], {"text": urls[1]}, {"type": "image_url", "image_url": {"url": urls[2]}}]
    body = {"query": item.query, "method": "vanilla", "documents": shapes, "seed": 1}
    by_url = client.post("/v1/rerank", json={**body, "top_n": 3, "return_documents": True})
    inline = client.post(
        "/v1/rerank",
        json={**body, "top_n": 3, "documents": [b64(im) for im in item.images]},
    )
    assert by_url.status_code == inline.status_code == 200, by_url.text
    out = by_url.json()
    assert [r["index"] for r in out["results"]] == [r["index"] for r in inline.json()["results"]]
    assert [r["document"] for r in out["results"]] == [  # echoed as sent: the URL, not bytes
        {"text": urls[0]} if r["index"] == 0 else shapes[r["index"]] for r in out["results"]
    ]
    assert out["meta"]["timings_ms"]["fetch"] > 0
    examples = [
        {
            "query": it.query,
            "images": serve_images(server, it.images, f"c{m}-"),
            "answer": it.target,
        }
        for m, it in enumerate(calibration_items)
    ]
    r = client.post("/v1/calibrate", json={"examples": examples})
    assert r.status_code == 200, r.text
    text = client.get("/metrics").text  # calibrate answers no timings: its stages are metrics
    assert metric_value(text, "lad_media_fetches_total", outcome="ok") == 3 + 3 * len(examples)
    assert 'lad_stage_duration_seconds_count{method="",stage="fetch"} 1.0' in text


def test_each_refusal_is_a_4xx_of_its_own(
    make_client: Any, server: MediaServer, items: list[RetrievalExample]
) -> None:
    item = items[0]
    good = serve_images(server, item.images, "g")
    server.set_big(10_000_000)

    inline = [b64(im) for im in item.images[:2]]

    def rerank(client: Any, url: str) -> Any:
        body = {"query": item.query, "method": "vanilla", "documents": [*inline, url]}
        return client.post("/v1/rerank", json=body)

    off = make_client()  # the default: no URL is fetched
    assert "LAD_MEDIA_ALLOWED_DOMAINS is empty" in error_of(
        rerank(off, good[2]), 400, "media_not_allowed"
    )
    client = make_client(**ALLOW, max_image_bytes=1_000_000, media_timeout_s=1.0)
    cases = [
        ("file:///etc/passwd", 400, "media_not_allowed", "never fetched"),
        ("http://example.com/a.png", 400, "media_not_allowed", "not in LAD_MEDIA_ALLOWED_DOMAINS"),
        (
            server.url("/redirect?to=http://169.254.169.254/latest/meta-data"),
            400,
            "media_not_allowed",
            "(a redirect)",
        ),
        (server.url("/big"), 413, "image_too_large", "declares 10000000 bytes"),
        (server.url("/flood"), 413, "image_too_large", "sent over 1000000 bytes"),
        (server.url("/slow"), 408, "media_fetch_timeout", "LAD_MEDIA_TIMEOUT_S=1"),
        (server.url("/status/404"), 422, "media_fetch_failed", "HTTP 404"),
        (server.url("/img/nothing.png"), 422, "media_fetch_failed", "HTTP 404"),
    ]
    for url, status, code, says in cases:
        message = error_of(rerank(client, url), status, code)
        assert says in message and "documents[2]" in message, (url, message)
    requested = [path for path, _ in server.requests]
    assert "/latest/meta-data" not in requested  # the hop was refused, never requested
    # a name that resolves to loopback: refused unless its network is allowed
    named = make_client(media_allowed_domains=["localhost"])
    message = error_of(
        rerank(named, server.url("/img/g0.png", "localhost")), 400, "media_not_allowed"
    )
    assert "resolves to a loopback address" in message and "127.0.0.1" not in message
    # a redirect from an allowed host to a loopback name it did not allow
    hop = server.url("/redirect?to=" + server.url("/img/g0.png", "localhost"))
    message = error_of(rerank(client, hop), 400, "media_not_allowed")
    assert "'localhost' is not in LAD_MEDIA_ALLOWED_DOMAINS" in message
    text = client.get("/metrics").text
    for outcome, count in (("not_allowed", 4), ("too_large", 2), ("timeout", 1), ("failed", 2)):
        assert metric_value(text, "lad_media_fetches_total", outcome=outcome) == count, outcome
    assert client.app.state.service.budget.used == 0


def test_256_documents_by_url_within_the_memory_bound(
    make_client: Any, server: MediaServer
) -> None:
    """The done-when line of issue 39 item 2: 256 documents by URL from a local server, the
    forward count and the fetch time in the answer, the byte budget never over capacity:
    what it holds is the fetched bytes (charged until the end) and one batch of windows'
    pixels, never the 256 documents' pixels."""
    side, batch, count = 64, 4, 256
    client = make_client(**ALLOW, max_batch_size=batch)
    service = client.app.state.service
    images = [
        Image.new("RGB", (side, side), (i % 256, (7 * i) % 256, (13 * i) % 256))
        for i in range(count)
    ]
    urls = serve_images(server, images, "d")
    fetched = sum(len(png_bytes(im)) for im in images)
    payload = {"query": "a red circle", "documents": urls, "method": "vanilla", "seed": 3}
    r = client.post("/v1/rerank", json=payload)
    assert r.status_code == 200, r.text
    out = r.json()
    window = service.settings.max_images
    planned = window_sizes(count, window, 1)
    assert out["usage"]["forward_passes"] == out["meta"]["forward_passes"]
    assert out["meta"]["forward_passes"] == sum(len(w) for w in planned)
    assert out["usage"]["images"] == count
    assert sorted(x["index"] for x in out["results"]) == list(range(count))
    assert out["meta"]["timings_ms"]["fetch"] > 0
    assert len([p for p, _ in server.requests if p.startswith("/img/d")]) == count
    one_batch = batch * window * side * side * PIXEL_BYTES
    all_pixels = count * side * side * PIXEL_BYTES
    peak, capacity = service.budget.peak, service.budget.capacity
    assert fetched <= peak <= capacity  # the fetched bytes were charged while held
    assert peak - fetched <= one_batch + RESERVE_STEP + 64 * 1024  # + the small body
    assert one_batch < all_pixels / 4
    assert service.budget.used == 0
