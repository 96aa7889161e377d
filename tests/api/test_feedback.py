"""POST /v1/feedback and POST /v1/profiles/{name}/refresh (online calibration, DESIGN §2.8)."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import numpy as np
import pytest

from app.method.calibrate import CalibrationStats
from calibration_store import Evidence, Profile, open_store
from tests.api.helpers import metric_value, retrieve_body
from tests.integration.calibration_store.stores import read_only

ADMIN, RETRIEVE = "admin-secret-token-123", "retrieve-secret-token-456"


def _calibrated(make_client, calibrate_json, **settings: Any):
    client = make_client(**settings)
    headers = {"Authorization": f"Bearer {ADMIN}"} if "admin_token" in settings else {}
    assert client.post("/v1/calibrate", json=calibrate_json, headers=headers).status_code == 200
    return client


def _retrieve(client, item, headers=None) -> str:
    r = client.post("/v1/retrieve", json=retrieve_body(item), headers=headers or {})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["request_id"] == r.headers["x-request-id"]
    return body["request_id"]


def test_feedback_counts_once_and_shows_on_the_profile(make_client, items, calibrate_json):
    client = _calibrated(make_client, calibrate_json)
    cal = client.get("/v1/profiles/default").json()["entries"][0]["online"]
    assert cal["feedback"] == 0 and cal["diagnostics"]["loo_accuracy"] is not None
    ids = [_retrieve(client, item) for item in items[:4]]
    first = client.post("/v1/feedback", json={"request_id": ids[0], "answer": items[0].target})
    assert first.status_code == 200, first.text
    assert first.json()["counted"] is True and first.json()["n"] == 3
    again = client.post("/v1/feedback", json={"request_id": ids[0], "answer": 2})
    assert again.status_code == 200
    assert again.json()["counted"] is False and again.json()["answer"] == items[0].target
    for rid, item in zip(ids[1:], items[1:4], strict=True):
        assert client.post("/v1/feedback", json={"request_id": rid, "answer": item.target}).json()[
            "counted"
        ]
    online = client.get("/v1/profiles/default").json()["entries"][0]["online"]
    assert online["feedback"] == 4 and online["served_requests"] == 4
    assert sum(online["feedback_per_row"]) + online["feedback_held_out"] == 4
    assert online["drift"]["requests"] == 4 and 0 <= online["drift"]["distance"] <= 1
    metrics = client.get("/metrics").text
    assert metric_value(metrics, "lad_feedback_total", outcome="counted") == 4
    assert metric_value(metrics, "lad_feedback_total", outcome="duplicate") == 1


def test_unknown_and_invalid_feedback(make_client, items, calibrate_json):
    client = _calibrated(make_client, calibrate_json)
    r = client.post("/v1/feedback", json={"request_id": "never-seen", "answer": 0})
    assert r.status_code == 404 and r.json()["error"]["code"] == "request_not_found"
    rid = _retrieve(client, items[0])
    r = client.post("/v1/feedback", json={"request_id": rid, "answer": 3})  # N = 3
    assert r.status_code == 422
    r = client.post("/v1/feedback", json={"request_id": rid, "answer": -1})
    assert r.status_code == 422
    assert (
        client.post(
            "/v1/feedback", content=b"x", headers={"content-type": "text/plain"}
        ).status_code
        == 415
    )


def test_expired_evidence_is_404(make_client, items, calibrate_json):
    client = _calibrated(make_client, calibrate_json, evidence_ttl_s=0.05)
    rid = _retrieve(client, items[0])
    time.sleep(0.2)
    r = client.post("/v1/feedback", json={"request_id": rid, "answer": 0})
    assert r.status_code == 404 and "older than" in r.json()["error"]["message"]


def test_feedback_for_a_deleted_profile_is_409(make_client, items, calibrate_json):
    client = _calibrated(make_client, calibrate_json)
    rid = _retrieve(client, items[0])
    assert client.delete("/v1/profiles/default", params={"n": 3}).status_code == 200
    r = client.post("/v1/feedback", json={"request_id": rid, "answer": 0})
    assert r.status_code == 409 and r.json()["error"]["code"] == "profile_deleted"


def test_feedback_auth(make_client, items, calibrate_json):
    client = _calibrated(make_client, calibrate_json, admin_token=ADMIN, retrieve_token=RETRIEVE)
    rid = _retrieve(client, items[0], {"Authorization": f"Bearer {RETRIEVE}"})
    body = {"request_id": rid, "answer": 0}
    assert client.post("/v1/feedback", json=body).status_code == 401
    bad = client.post("/v1/feedback", json=body, headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 403
    ok = client.post("/v1/feedback", json=body, headers={"Authorization": f"Bearer {RETRIEVE}"})
    assert ok.status_code == 200 and ok.json()["counted"]
    admin = client.post("/v1/feedback", json=body, headers={"Authorization": f"Bearer {ADMIN}"})
    assert admin.status_code == 200 and not admin.json()["counted"]
    # refresh is an admin route: the retrieve token is not enough
    r = client.post(
        "/v1/profiles/default/refresh",
        params={"n": 3},
        headers={"Authorization": f"Bearer {RETRIEVE}"},
    )
    assert r.status_code == 403


# ---------------------------------------------------------------------------- refresh guard
N, LAYERS = 3, None


def _flat_profile(runner: Any) -> Profile:
    """A live version with B = 0 and a uniform prior, from 5 offline examples of zeros."""
    layers = list(runner.layers)
    offline = CalibrationStats(np.zeros((N, N)), np.full(N, 5), np.full((len(layers), N), 15.0), 15)
    return Profile.create(
        name="default",
        fingerprint=runner.fingerprint("digits", N),
        layers=layers,
        bias_matrix=np.zeros((N, N)),
        attention_prior=np.full((len(layers), N), 1.0),
        num_examples=5,
        num_forward_passes=15,
        calibration_statistics=offline.to_dict(),
    )


def _feed(client, runner: Any, rows: dict[bool, Any], count: int) -> None:
    """``count`` feedback instances spread over the GT positions; a training instance of GT
    t gets scores rows[False](t), a held-out one rows[True](t). Attention is flat, so the
    posterior is uniform and only B decides."""
    service = client.app.state.service
    key = service.profiles.key("default", "digits", N)
    flat = np.full((len(runner.layers), N), 1.0)
    for i in range(count):
        rid, t, held = f"guard-{i}", i % N, i % 5 == 0  # the test fixes the server's draw
        evidence = Evidence.of(key, 1, rows[held](t), flat, held_out=held)
        assert service.online.online.put_evidence(rid, evidence)
        r = client.post("/v1/feedback", json={"request_id": rid, "answer": t})
        assert r.status_code == 200 and r.json()["counted"], r.text


def _onehot(t: int, value: float = 1.0) -> np.ndarray:
    s = np.zeros(N)
    s[t] = value
    return s


def _poisoned(t: int) -> np.ndarray:
    return _onehot(0, 50.0)  # whatever the GT, the model "prefers" position 0 in training


def test_a_refresh_that_would_lose_accuracy_stays_a_candidate(make_client, runner):
    store = open_store("memory://")
    store.put(_flat_profile(runner))
    client = make_client(store=store, feedback_min_row_count=5, refresh_min_holdout=5)
    _feed(client, runner, {False: _poisoned, True: _onehot}, 90)
    r = client.post("/v1/profiles/default/refresh", params={"n": N})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["live"] is False and "would lose accuracy" in body["reason"]
    assert body["accuracy_live"] == 1.0 and body["accuracy_refreshed"] < 1.0
    held = body["diagnostics"]["held_out_accuracy"]
    assert held["live"]["agd"] == 1.0 and held["refreshed"]["agd"] == body["accuracy_refreshed"]
    assert set(held["live"]) == {"vanilla", "attn_pure", "agd"}
    assert body["version"] is None and body["held_out"] >= 5
    detail = client.get("/v1/profiles/default").json()["entries"][0]
    assert detail["current_version"] == 1
    assert detail["online"]["last_refresh"]["live"] is False
    # the operator may still force it; then it is a new version, rollback-able as any other
    forced = client.post("/v1/profiles/default/refresh", params={"n": N, "force": True}).json()
    assert forced["live"] is True and forced["version"] == 2
    assert forced["provenance"]["feedback"] == 90 and forced["provenance"]["forced"] is True
    back = client.post("/v1/profiles/default/rollback", params={"n": N})
    assert back.status_code == 200 and back.json()["version"] == 1
    metrics = client.get("/metrics").text
    assert metric_value(metrics, "lad_profile_refreshes_total", decision="candidate") == 1
    assert metric_value(metrics, "lad_profile_refreshes_total", decision="live") == 1


def test_a_refresh_that_keeps_accuracy_goes_live(make_client, runner):
    store = open_store("memory://")
    store.put(_flat_profile(runner))
    client = make_client(store=store, feedback_min_row_count=5, refresh_min_holdout=5)
    _feed(client, runner, {False: _onehot, True: _onehot}, 60)
    body = client.post("/v1/profiles/default/refresh", params={"n": N}).json()
    assert body["live"] is True and body["version"] == 2
    assert body["accuracy_refreshed"] >= body["accuracy_live"]
    prov = body["provenance"]
    assert prov["rows_from_feedback"] == [0, 1, 2] and prov["offline_examples"] == 5
    assert client.get("/v1/profiles/default").json()["entries"][0]["current_version"] == 2


def _old_rule(request_id: str) -> bool:
    """The held-out rule before the server's draw: a hash of the client's own X-Request-ID."""
    return hashlib.sha256(request_id.encode()).digest()[0] % 5 == 0


def test_a_client_cannot_choose_which_feedback_is_held_out(make_client, calibrate_json, items):
    """Real retrievals under X-Request-IDs the old rule held out (all of them, then): now the
    server's draw holds out about 1 in 5, whatever the ids."""
    client = _calibrated(make_client, calibrate_json)
    ids = [rid for rid in (f"pick-{i}" for i in range(1000)) if _old_rule(rid)][:40]
    held = 0
    for i, rid in enumerate(ids):
        r = client.post(
            "/v1/retrieve", json=retrieve_body(items[i % len(items)]), headers={"X-Request-ID": rid}
        )
        assert r.status_code == 200 and r.json()["request_id"] == rid
        fb = client.post("/v1/feedback", json={"request_id": rid, "answer": 0}).json()
        assert fb["counted"], fb
        held += fb["held_out"]
    assert held <= 18, held  # binomial(40, 1/5): mean 8, P(>= 19) < 1e-4; the old rule: 40


def test_feedback_steered_at_the_old_held_out_rule_does_not_go_live(make_client, runner):
    """The issue's attack: feedback on ids the attacker believes held out is confidently wrong
    for the live version (live scores 0 there), the rest poisons the sums (half of it pulls
    position 0, half is honest). On the old rule an ordinary refresh went live with a version
    that loses honest accuracy; with the server's draw the guard sees a fair sample of it."""
    store = open_store("memory://")
    store.put(_flat_profile(runner))
    client = make_client(store=store, feedback_min_row_count=5, refresh_min_holdout=5)
    service = client.app.state.service
    key = service.profiles.key("default", "digits", N)
    flat = np.full((len(runner.layers), N), 1.0)
    believed_held, held = set(), set()
    for i in range(300):
        rid, t = f"steer-{i}", i % N
        if _old_rule(rid):
            scores = _onehot((t + 1) % N, 100.0)
            believed_held.add(rid)
        else:
            scores = _poisoned(t) if i % 2 else _onehot(t)
        assert service.online.online.put_evidence(rid, Evidence.of(key, 1, scores, flat))
        r = client.post("/v1/feedback", json={"request_id": rid, "answer": t})
        assert r.status_code == 200 and r.json()["counted"], r.text
        if r.json()["held_out"]:
            held.add(rid)
    body = client.post("/v1/profiles/default/refresh", params={"n": N}).json()
    assert body["live"] is False, body["reason"]  # simulated: 0 of 5000 draws went live
    # the server's draw, not the attacker's: the held-out ids differ (their counts, both
    # about 300 / 5, can be equal by chance: about 1 run in 17)
    assert body["accuracy_live"] > 0 and body["held_out"] == len(held) and held != believed_held
    assert client.get("/v1/profiles/default").json()["entries"][0]["current_version"] == 1


def test_too_little_held_out_feedback_keeps_a_candidate(make_client, runner):
    store = open_store("memory://")
    store.put(_flat_profile(runner))
    client = make_client(store=store, refresh_min_holdout=1000)
    _feed(client, runner, {False: _onehot, True: _onehot}, 12)
    body = client.post("/v1/profiles/default/refresh", params={"n": N}).json()
    assert body["live"] is False and "LAD_REFRESH_MIN_HOLDOUT" in body["reason"]


def test_automatic_refresh_after_the_threshold(make_client, runner):
    store = open_store("memory://")
    store.put(_flat_profile(runner))
    client = make_client(
        store=store, feedback_min_row_count=5, refresh_min_holdout=1, feedback_refresh_every=30
    )
    service = client.app.state.service
    key = service.profiles.key("default", "digits", N)
    flat = np.full((len(runner.layers), N), 1.0)
    triggered = []
    for i in range(30):
        rid = f"auto-{i}"
        service.online.online.put_evidence(rid, Evidence.of(key, 1, _onehot(i % N), flat))
        r = client.post("/v1/feedback", json={"request_id": rid, "answer": i % N}).json()
        triggered.append(r["refresh"])
    assert all(t is None for t in triggered[:-1]) and triggered[-1] is not None
    assert triggered[-1]["live"] is True and store.get(key).version == 2


def test_refresh_of_a_profile_without_offline_statistics_is_409(make_client, runner):
    store = open_store("memory://")
    store.put(_flat_profile(runner).model_copy(update={"calibration_statistics": None}))
    client = make_client(store=store)
    r = client.post("/v1/profiles/default/refresh", params={"n": N})
    assert r.status_code == 409 and r.json()["error"]["code"] == "refresh_unavailable"
    assert client.post("/v1/profiles/nope/refresh", params={"n": N}).status_code == 404


def test_clients_close_the_loop(make_client, items, calibration_items):
    """retrieve -> feedback -> refresh through LadClient and AsyncLadClient."""
    import asyncio

    from lad_client import AsyncLadClient, LadClient, LadError

    http = make_client(admin_token=ADMIN, refresh_min_holdout=1000)
    lad = LadClient(http=http, admin_token=ADMIN)
    lad.calibrate([(it.query, it.images, it.target) for it in calibration_items])
    answer = lad.retrieve(items[0].query, items[0].images)
    done = lad.feedback(answer.request_id, items[0].target)
    assert done.counted and not lad.feedback(answer.request_id, items[0].target).counted
    refreshed = lad.refresh("default", 3)
    assert refreshed.live is False and refreshed.previous_version == 1
    with pytest.raises(LadError) as unknown:
        lad.feedback("no-such-request", 0)
    assert unknown.value.status == 404 and unknown.value.code == "request_not_found"

    async def run() -> None:
        client = AsyncLadClient(http=_AsyncBridge(http), admin_token=ADMIN)
        assert (await client.feedback(answer.request_id, 0)).counted is False
        assert (await client.refresh("default", 3, force=True)).version == 2

    asyncio.run(run())


class _AsyncBridge:
    """An httpx.AsyncClient look-alike over the sync TestClient (the app runs in its portal)."""

    def __init__(self, client) -> None:
        self.client = client

    async def request(self, **kwargs):
        return self.client.request(**kwargs)

    async def aclose(self) -> None:
        return None


def test_file_backend_keeps_feedback_across_a_restart(make_client, items, calibrate_json, tmp_path):
    first = _calibrated(make_client, calibrate_json, store_url=str(tmp_path))
    rid = _retrieve(first, items[0])
    assert first.post("/v1/feedback", json={"request_id": rid, "answer": 1}).json()["counted"]
    first.__exit__(None, None, None)
    second = make_client(store_url=str(tmp_path))
    assert second.get("/readyz").json()["store"].get("unreadable_profiles") is None
    online = second.get("/v1/profiles/default").json()["entries"][0]["online"]
    assert online["feedback"] == 1 and online["served_requests"] == 1
    r = second.post("/v1/feedback", json={"request_id": rid, "answer": 1})
    assert r.status_code == 404  # the evidence itself is short-lived: not persisted


def test_a_stream_of_invented_profile_names_keeps_no_state(
    make_client, items, calibrate_json, tmp_path
):
    """Issue 29: every vanilla retrieve naming a fresh (profile, labels, N) kept unlabelled
    statistics forever (memory, a Redis hash, the file store's state file). Only profiles
    that exist keep them now."""
    client = _calibrated(make_client, calibrate_json, store_url=str(tmp_path))
    served = client.post("/v1/retrieve", json=retrieve_body(items[0]))
    assert served.status_code == 200
    state = sorted(p for p in tmp_path.rglob("*") if p.is_file() and "online" in p.name)
    before = {p: p.read_bytes() for p in state}
    ids = []
    for i in range(40):
        body = retrieve_body(items[i % len(items)], method="vanilla", profile=f"fresh-{i}")
        r = client.post("/v1/retrieve", json=body)
        assert r.status_code == 200, r.text
        ids.append(r.json()["request_id"])
    online = client.app.state.service.online.online
    assert all("fresh-" not in kid for kid in online._ul), list(online._ul)[:3]
    assert {p: p.read_bytes() for p in state} == before  # the state file did not grow
    assert b"fresh-" not in b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    refused = client.post("/v1/feedback", json={"request_id": ids[0], "answer": 0})
    assert refused.status_code == 404  # no evidence was kept for an invented name
    # an existing profile still counts its served requests, vanilla ones included
    vanilla = client.post("/v1/retrieve", json=retrieve_body(items[1], method="vanilla"))
    assert vanilla.status_code == 200
    online_block = client.get("/v1/profiles/default").json()["entries"][0]["online"]
    assert online_block["served_requests"] == 2


def test_a_read_only_store_serves_refuses_writes_and_never_half_counts(
    make_client, items, calibrate_json, tmp_path
):
    """Issue 29: a file store on a read-only mount serves what it holds (main: did not
    start), readiness is degraded with ``writes: failing``, a calibration is refused before
    it computes, and feedback refused with 503 is not counted (main: the retry answered
    ``counted: false``)."""
    first = _calibrated(make_client, calibrate_json, store_url=str(tmp_path))
    first.__exit__(None, None, None)
    with read_only(tmp_path):
        client = make_client(store_url=str(tmp_path))
        ready = client.get("/readyz").json()
        assert ready["status"] == "degraded" and ready["store"]["writes"] == "failing"
        served = client.post("/v1/retrieve", json=retrieve_body(items[1]))
        assert served.status_code == 200 and served.json()["profile"]["version"] == 1
        assert client.get("/v1/profiles/default").status_code == 200
        start = time.monotonic()
        refused = client.post("/v1/calibrate", json=calibrate_json)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "store_unavailable"
        assert time.monotonic() - start < 2.0  # refused before the forward passes
        assert client.delete("/v1/profiles/default", params={"n": 3}).status_code == 503
        rid2 = _retrieve(client, items[2])
        fb = client.post("/v1/feedback", json={"request_id": rid2, "answer": 1})
        assert fb.status_code == 503, fb.text
    retry = client.post("/v1/feedback", json={"request_id": rid2, "answer": 1})
    assert retry.status_code == 200 and retry.json()["counted"] is True
    online = client.get("/v1/profiles/default").json()["entries"][0]["online"]
    assert online["feedback"] == 1
