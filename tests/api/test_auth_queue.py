"""Bearer tokens (401 missing, 403 wrong) and back-pressure (429 with Retry-After)."""

from __future__ import annotations

import concurrent.futures
import time

from tests.api.helpers import GatedRunner, retrieve_body

RETRIEVE, ADMIN = "retrieve-secret", "admin-secret"


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_retrieve_token(make_client, items):
    client = make_client(retrieve_token=RETRIEVE, admin_token=ADMIN)
    body = retrieve_body(items[0], method="vanilla")
    r = client.post("/v1/retrieve", json=body)
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert r.headers["www-authenticate"] == "Bearer"
    r = client.post("/v1/retrieve", json=body, headers={"Authorization": "Basic abc"})
    assert r.status_code == 401
    r = client.post("/v1/retrieve", json=body, headers=_auth("wrong"))
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    assert client.post("/v1/retrieve", json=body, headers=_auth(RETRIEVE)).status_code == 200
    assert client.post("/v1/retrieve", json=body, headers=_auth(ADMIN)).status_code == 200
    # health, readiness and metrics stay open for probes and scrapers
    for path in ("/healthz", "/readyz", "/metrics", "/v1/profiles"):
        assert client.get(path).status_code == 200, path


def test_admin_token_guards_calibrate_delete_rollback(make_client, calibrate_json):
    client = make_client(retrieve_token=RETRIEVE, admin_token=ADMIN)
    assert client.post("/v1/calibrate", json=calibrate_json).status_code == 401
    r = client.post("/v1/calibrate", json=calibrate_json, headers=_auth(RETRIEVE))
    assert r.status_code == 403
    r = client.post("/v1/calibrate", json=calibrate_json, headers=_auth(ADMIN))
    assert r.status_code == 200, r.text
    client.post("/v1/calibrate", json=calibrate_json, headers=_auth(ADMIN))
    assert client.post("/v1/profiles/default/rollback?n=3").status_code == 401
    r = client.post("/v1/profiles/default/rollback?n=3", headers=_auth(RETRIEVE))
    assert r.status_code == 403
    r = client.post("/v1/profiles/default/rollback?n=3", headers=_auth(ADMIN))
    assert r.status_code == 200 and r.json()["version"] == 1
    assert client.delete("/v1/profiles/default?n=3").status_code == 401
    assert client.delete("/v1/profiles/default?n=3", headers=_auth("nope")).status_code == 403
    assert client.delete("/v1/profiles/default?n=3", headers=_auth(ADMIN)).status_code == 200


def test_no_tokens_configured_means_open(client, calibrate_json):
    assert client.post("/v1/calibrate", json=calibrate_json).status_code == 200


def test_only_retrieve_token_leaves_admin_open_and_admin_token_alone_leaves_retrieve_open(
    make_client, items, calibrate_json
):
    client = make_client(admin_token=ADMIN)
    body = retrieve_body(items[0], method="vanilla")
    assert client.post("/v1/retrieve", json=body).status_code == 200
    assert client.post("/v1/calibrate", json=calibrate_json).status_code == 401


def test_full_queue_answers_429_with_retry_after(make_client, runner, items):
    gated = GatedRunner(runner)
    client = make_client(runner_override=gated, max_batch_size=1, max_wait_ms=0, max_queue=2)
    body = retrieve_body(items[0], method="vanilla")
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        busy = pool.submit(client.post, "/v1/retrieve", json=body)  # held in the worker
        assert gated.entered.wait(10)
        queued = [pool.submit(client.post, "/v1/retrieve", json=body) for _ in range(2)]
        deadline = time.monotonic() + 10
        while client.get("/readyz").json()["queue"]["depth"] < 2:
            assert time.monotonic() < deadline, "requests never queued"
            time.sleep(0.01)
        r = client.post("/v1/retrieve", json=body)
        assert r.status_code == 429
        assert r.json()["error"]["code"] == "overloaded"
        assert int(r.headers["retry-after"]) >= 1
        gated.gate.set()
        assert busy.result(30).status_code == 200
        assert [f.result(30).status_code for f in queued] == [200, 200]
    assert client.post("/v1/retrieve", json=body).status_code == 200
    metrics = client.get("/metrics").text
    assert 'lad_requests_total{http_method="POST",route="/v1/retrieve",status="429"} 1.0' in metrics
