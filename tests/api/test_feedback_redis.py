"""Feedback across replicas on a real Redis: every request id counted exactly once.

Two apps (each a real uvicorn server, as `lad serve` runs it) share one Redis under a
test prefix. Every feedback is sent to both replicas at the same moment, from threads;
the shared statistics must hold each request exactly once, with exactly its floats.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest

from app.main import create_app
from app.settings import Settings
from calibration_store import Evidence
from tests.api.conftest import LiveServer
from tests.api.helpers import retrieve_body
from tests.conftest import REDIS_URL

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture
def replicas(runner: Any, redis_prefix: str):
    servers = []
    for _ in range(2):
        settings = Settings(
            _env_file=None, store_url=REDIS_URL, store_key_prefix=redis_prefix, max_queue=256
        )
        servers.append(LiveServer(create_app(settings, runner=runner), settings))
    yield servers
    for server in servers:
        server.stop()


def _wait_until_served(url: str, body: dict[str, Any]) -> None:
    import time

    deadline = time.monotonic() + 10
    while httpx.post(f"{url}/v1/retrieve", json=body, timeout=30).status_code != 200:
        assert time.monotonic() < deadline, "the second replica never saw the profile"
        time.sleep(0.05)


def test_concurrent_feedback_from_two_replicas_counts_each_once(replicas, items, calibrate_json):
    a, b = replicas
    assert httpx.post(f"{a.url}/v1/calibrate", json=calibrate_json, timeout=120).status_code == 200
    _wait_until_served(b.url, retrieve_body(items[0]))
    # real retrievals on both replicas leave their evidence in the shared cache
    served = []
    for i, item in enumerate(items):
        url = (a, b)[i % 2].url
        r = httpx.post(f"{url}/v1/retrieve", json=retrieve_body(item), timeout=60)
        assert r.status_code == 200
        served.append((r.json()["request_id"], item.target))
    service = a.server.config.app.state.service
    online = service.online.online
    key = service.profiles.key("default", "digits", 3)
    layers = len(service.runner.layers)
    # plus many synthetic ones (the same store call retrieve makes), to press the race
    rng = np.random.default_rng(0)
    for i in range(150):
        rid = f"synthetic-{i}"
        ev = Evidence.of(key, 1, rng.normal(size=3), rng.random(size=(layers, 3)))
        assert online.put_evidence(rid, ev)
        served.append((rid, int(rng.integers(0, 3))))
    evidence = {rid: online.get_evidence(rid) for rid, _ in served}
    barrier = threading.Barrier(2)

    def send(url: str, rid: str, answer: int) -> bool:
        r = httpx.post(f"{url}/v1/feedback", json={"request_id": rid, "answer": answer}, timeout=30)
        assert r.status_code == 200, r.text
        return bool(r.json()["counted"])

    def both(rid: str, answer: int) -> list[bool]:
        with ThreadPoolExecutor(2) as pool:
            futures = [
                pool.submit(lambda u=u: (barrier.wait(), send(u, rid, answer))[1])
                for u in (a.url, b.url)
            ]
            return [f.result() for f in futures]

    with ThreadPoolExecutor(4) as outer:
        counted = list(outer.map(lambda pair: both(*pair), served))
    assert all(sum(c) == 1 for c in counted), "a feedback was counted twice or never"

    snap = online.snapshot(key, layers)
    expected_rows = np.zeros((3, 3))
    expected_counts = np.zeros(3, dtype=int)
    expected_prior = np.zeros((layers, 3))
    held = 0
    for rid, answer in served:
        ev = evidence[rid]
        if ev.held_out:  # the server's draw, stored with the evidence
            held += 1
            continue
        expected_rows[answer] += ev.scores
        expected_counts[answer] += 1
        expected_prior += np.asarray(ev.attention)
    assert snap.count == len(served) and snap.holdout_count == held == len(snap.holdout)
    np.testing.assert_array_equal(snap.row_counts, expected_counts)
    assert snap.prior_count == len(served) - held
    np.testing.assert_allclose(snap.row_sums, expected_rows, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(snap.prior_sums, expected_prior, rtol=1e-9, atol=1e-9)
    # every served request, either replica: + the one that found the profile on b
    assert snap.unlabelled_count == len(served) + 1

    # a refresh on one replica is judged on the shared statistics; the other one sees it
    refreshed = httpx.post(f"{b.url}/v1/profiles/default/refresh", params={"n": 3}, timeout=60)
    assert refreshed.status_code == 200, refreshed.text
    decision = refreshed.json()
    assert decision["held_out"] == held and decision["provenance"]["feedback"] == len(served)
    seen = httpx.get(f"{a.url}/v1/profiles/default", timeout=30).json()["entries"][0]["online"]
    assert seen["last_refresh"]["live"] == decision["live"]
    assert seen["feedback"] == len(served) and seen["feedback_since_refresh"] == 0
