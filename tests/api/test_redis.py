"""The service on a real Redis store (LAD_TEST_REDIS_URL, default redis://127.0.0.1:6379/15).

Each test uses its own key prefix, removed afterwards. The apps open and close the Redis
store themselves from their settings, as in production.
"""

from __future__ import annotations

import time

import pytest

from tests.api.helpers import retrieve_body
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.redis


def _replica(make_client, prefix: str, **overrides):
    return make_client(store_url=REDIS_URL, store_key_prefix=prefix, **overrides)


def _wait_for(predicate, timeout: float = 2.0) -> float:
    """Seconds until predicate() holds; fails after `timeout`."""
    start = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not true within {timeout} s")
        time.sleep(0.02)


def test_calibrate_and_serve_on_redis(make_client, redis_prefix, items, calibrate_json):
    client = _replica(make_client, redis_prefix)
    assert client.get("/readyz").json()["store"]["backend"] == "redis"
    assert client.post("/v1/retrieve", json=retrieve_body(items[0])).status_code == 409
    cal = client.post("/v1/calibrate", json=calibrate_json)
    assert cal.status_code == 200 and cal.json()["version"] == 1
    body = client.post("/v1/retrieve", json=retrieve_body(items[0])).json()
    assert body["profile"] == {"name": "default", "version": 1}
    detail = client.get("/v1/profiles/default").json()
    assert detail["entries"][0]["versions"][0]["version"] == 1


def test_restart_keeps_profiles(make_client, redis_prefix, items, calibrate_json):
    first = _replica(make_client, redis_prefix)
    first.post("/v1/calibrate", json=calibrate_json)
    first.__exit__(None, None, None)  # shut the first replica down (closes its store)
    second = _replica(make_client, redis_prefix)
    r = second.post("/v1/retrieve", json=retrieve_body(items[0]))
    assert r.status_code == 200 and r.json()["profile"]["version"] == 1


def test_two_replicas_share_calibrations_within_2_s(
    make_client, redis_prefix, items, calibrate_json
):
    a = _replica(make_client, redis_prefix)
    b = _replica(make_client, redis_prefix)
    body = retrieve_body(items[1])
    assert b.post("/v1/retrieve", json=body).status_code == 409

    assert a.post("/v1/calibrate", json=calibrate_json).json()["version"] == 1
    _wait_for(lambda: b.post("/v1/retrieve", json=body).status_code == 200)
    answer_a = a.post("/v1/retrieve", json=body).json()
    answer_b = b.post("/v1/retrieve", json=body).json()
    assert answer_b["profile"] == {"name": "default", "version": 1}
    assert answer_b["probabilities"] == pytest.approx(answer_a["probabilities"], abs=1e-9)

    # a second calibration on B, then a rollback on A: both replicas follow
    fewer = {**calibrate_json, "examples": calibrate_json["examples"][:2]}
    assert b.post("/v1/calibrate", json=fewer).json()["version"] == 2
    _wait_for(lambda: a.post("/v1/retrieve", json=body).json()["profile"]["version"] == 2)
    assert a.post("/v1/profiles/default/rollback", params={"n": 3}).json()["version"] == 1
    _wait_for(lambda: b.post("/v1/retrieve", json=body).json()["profile"]["version"] == 1)
    metrics = b.get("/metrics").text
    assert 'lad_profile_version{labels="digits",n="3",profile="default"} 1.0' in metrics

    # deletion propagates too
    assert a.delete("/v1/profiles/default", params={"n": 3}).status_code == 200
    _wait_for(lambda: b.post("/v1/retrieve", json=body).status_code == 409)


def test_every_n_calibration_reaches_another_replica(make_client, redis_prefix):
    """n = all on replica A (one Lua script for every N); replica B reranks with them."""
    from lad_lab.demo.world import make_items
    from tests.api.helpers import b64, calibration_body

    a = _replica(make_client, redis_prefix)
    b = _replica(make_client, redis_prefix)
    wide = make_items(2, n_candidates=4, setting="random", seed="calibration", image_size=56)
    out = a.post("/v1/calibrate", json=calibration_body(wide, n="all")).json()
    assert [(e["n"], e["version"]) for e in out["per_n"]] == [(2, 1), (3, 1), (4, 1)]
    many = make_items(1, n_candidates=9, setting="random", seed="eval", image_size=56)[0]
    body = {"query": many.query, "documents": [b64(im) for im in many.images], "seed": 3}
    _wait_for(lambda: b.post("/v1/rerank", json=body).status_code == 200)
    meta = b.post("/v1/rerank", json=body).json()["meta"]
    assert meta["window"] == 4 and meta["profile"] == {"3": 1}  # windows [[3, 3, 3], [3]]
    entries = b.get("/v1/profiles/default").json()["entries"]
    assert sorted(e["n"] for e in entries) == [2, 3, 4]


def _metric(client, line_start: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric line {line_start}")


def test_a_corrupt_document_is_store_corrupt_logged_and_counted(
    make_client, redis_prefix, items, calibrate_json, caplog
):
    import redis

    client = _replica(make_client, redis_prefix)
    assert client.post("/v1/calibrate", json=calibrate_json).json()["version"] == 1
    admin = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    (doc,) = admin.keys(f"{redis_prefix}:profile:*")
    good = admin.get(doc)
    online = doc.replace(":profile:", ":fb:").removesuffix(":v1")
    corruptions = [
        lambda: admin.set(doc, good[:200]),  # a cut document
        lambda: admin.set(doc, '{"schema_version": 1, "name": 7}'),  # valid JSON, invalid
        lambda: admin.hset(online, "last_refresh", "{not json"),  # its online statistics
    ]
    for corrupt in corruptions:
        admin.set(doc, good)
        admin.hdel(online, "last_refresh")
        assert client.get("/v1/profiles/default").status_code == 200
        corrupt()
        caplog.clear()
        r = client.get("/v1/profiles/default")
        assert r.status_code == 500, r.text
        assert r.json()["error"]["code"] == "store_corrupt"
        assert redis_prefix not in r.text  # the key is for the operator's log, not the client
        assert any(
            redis_prefix in rec.getMessage() and rec.levelname == "ERROR" for rec in caplog.records
        )
    assert _metric(client, 'lad_errors_total{code="store_corrupt"}') == len(corruptions)
    # retrieval keeps serving the copy it had
    assert client.post("/v1/retrieve", json=retrieve_body(items[0])).status_code == 200
    admin.close()
