"""The online state backends (memory, file, Redis): bounded evidence cache, exactly-once
feedback, the profile check, persistence of the file backend's statistics."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from calibration_store import Evidence, OnlineStore, ProfileKey, open_online_store
from calibration_store.evidence import COUNTED, DUPLICATE, PROFILE_GONE, UNKNOWN
from tests.conftest import REDIS_URL

KEY = ProfileKey(model_id="m", name="default", label_scheme="digits", n=3)


def _evidence(seed: int) -> Evidence:
    rng = np.random.default_rng(seed)
    return Evidence.of(
        KEY, 1, rng.normal(size=3), rng.random(size=(2, 3)), held_out=seed % 5 == 0
    )  # a fixed split: the expected sums are exact


@pytest.fixture(params=["memory", "file", pytest.param("redis", marks=pytest.mark.redis)])
def online(request, tmp_path: Path) -> Iterator[OnlineStore]:
    if request.param == "redis":
        prefix = request.getfixturevalue("redis_prefix")
        store = open_online_store(REDIS_URL, key_prefix=prefix, ttl_s=60, max_entries=5)
        _make_current(prefix)
    else:
        url = "memory://" if request.param == "memory" else str(tmp_path)
        store = open_online_store(url, ttl_s=60, max_entries=5)
    yield store
    store.close()


def _make_current(prefix: str) -> None:
    """The profile pointer the Redis feedback script checks (what a profile put writes)."""
    import redis

    from calibration_store.redis_store import encode_key

    client = redis.Redis.from_url(REDIS_URL)
    client.hset(f"{prefix}:current:{encode_key(KEY)}", mapping={"version": 1, "rev": 1})
    client.close()


def test_evidence_is_bounded_by_count_oldest_first(online: OnlineStore) -> None:
    for i in range(8):
        assert online.put_evidence(f"r{i}", _evidence(i))
    assert [online.get_evidence(f"r{i}") is None for i in range(8)] == [True] * 3 + [False] * 5
    assert online.get_evidence("r7").scores == _evidence(7).scores
    assert not online.put_evidence("r7", _evidence(99))  # first retrieval keeps its id
    assert online.get_evidence("r7").scores == _evidence(7).scores


def test_feedback_is_counted_once_with_its_floats(online: OnlineStore) -> None:
    ids = [f"q{i}" for i in range(4)]
    for i, rid in enumerate(ids):
        online.put_evidence(rid, _evidence(i))
    assert online.feedback("nope", 0, True).outcome == UNKNOWN
    results = [online.feedback(rid, i % 3, True) for i, rid in enumerate(ids)]
    assert [r.outcome for r in results] == [COUNTED] * 4
    assert [r.held_out for r in results] == [_evidence(i).held_out for i in range(4)]
    again = online.feedback(ids[0], 2, True)
    assert again.outcome == DUPLICATE and again.answer == 0
    snap = online.snapshot(KEY, 2)
    train = [(i, rid) for i, rid in enumerate(ids) if not _evidence(i).held_out]
    expected = np.zeros((3, 3))
    for i, _ in train:
        expected[i % 3] += _evidence(i).scores
    np.testing.assert_allclose(snap.row_sums, expected, atol=1e-9)
    assert snap.count == 4 and snap.since_refresh == 4 and snap.prior_count == len(train)
    assert snap.unlabelled_count == 4 and snap.raw_positions.sum() == 4
    assert not online.claim_refresh(KEY, 5) and online.claim_refresh(KEY, 4)
    assert online.snapshot(KEY, 2).since_refresh == 0


def test_evidence_expires(tmp_path: Path) -> None:
    store = open_online_store("memory://", ttl_s=0.05)
    store.put_evidence("x", _evidence(0))
    time.sleep(0.15)
    assert store.get_evidence("x") is None and store.feedback("x", 0, True).outcome == UNKNOWN


def test_memory_backend_refuses_feedback_for_a_missing_profile() -> None:
    store = open_online_store("memory://")
    store.put_evidence("x", _evidence(0))
    assert store.feedback("x", 0, False).outcome == PROFILE_GONE
    assert store.snapshot(KEY, 2).count == 0


@pytest.mark.redis
def test_redis_checks_the_profile_pointer_itself(redis_prefix: str) -> None:
    store = open_online_store(REDIS_URL, key_prefix=redis_prefix)
    store.put_evidence("x", _evidence(0))
    assert store.feedback("x", 0, True).outcome == PROFILE_GONE  # no pointer: deleted
    store.close()


def test_file_backend_keeps_statistics_across_a_restart(tmp_path: Path) -> None:
    first = open_online_store(str(tmp_path))
    for i in range(6):
        first.put_evidence(f"f{i}", _evidence(i))
        first.feedback(f"f{i}", i % 3, True)
    before = first.snapshot(KEY, 2)
    second = open_online_store(str(tmp_path))
    after = second.snapshot(KEY, 2)
    np.testing.assert_array_equal(after.row_sums, before.row_sums)
    assert after.count == 6 and len(after.holdout) == len(before.holdout)
    assert second.get_evidence("f0") is None  # evidence is short-lived: not persisted
    second.reset(KEY)
    assert open_online_store(str(tmp_path)).snapshot(KEY, 2).count == 0
    from calibration_store import open_store

    assert not open_store(str(tmp_path)).health().get("errors")  # not read as a profile


def test_the_refresh_prior_comes_from_feedback_or_every_served_request() -> None:
    from app.method.refresh import online_stats

    store = open_online_store("memory://")
    for i in range(6):
        store.put_evidence(f"p{i}", _evidence(i))
    store.feedback("p0", 0, True)
    snap = store.snapshot(KEY, 2)
    assert online_stats(snap, "served").prior_count == 6
    assert online_stats(snap, "feedback").prior_count == snap.prior_count <= 1
    served = sum(np.asarray(_evidence(i).attention) for i in range(6))
    np.testing.assert_allclose(online_stats(snap, "served").prior_sums, served, atol=1e-9)
    with pytest.raises(ValueError, match="prior source"):
        online_stats(snap, "guess")


@pytest.mark.redis
def test_redis_evidence_expires_and_one_replica_claims_an_automatic_refresh(
    redis_prefix: str,
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    _make_current(redis_prefix)
    short = open_online_store(REDIS_URL, key_prefix=redis_prefix, ttl_s=0.05)
    short.put_evidence("gone", _evidence(0))
    time.sleep(0.2)
    assert short.get_evidence("gone") is None and short.feedback("gone", 0, True).outcome == UNKNOWN
    replicas = [open_online_store(REDIS_URL, key_prefix=redis_prefix) for _ in range(4)]
    for i in range(10):
        replicas[0].put_evidence(f"c{i}", _evidence(i))
        replicas[i % 4].feedback(f"c{i}", i % 3, True)
    with ThreadPoolExecutor(4) as pool:
        claims = list(pool.map(lambda s: s.claim_refresh(KEY, 10), replicas * 5))
    assert sum(claims) == 1
    for store in (short, *replicas):
        store.close()


def test_the_held_out_draw_is_the_servers_and_travels_with_the_evidence(
    online: OnlineStore,
) -> None:
    """Which feedback judges a refresh is drawn when the evidence is cached (1 in 5), stored
    with it, and is what the feedback obeys: the request id plays no part."""
    rng = np.random.default_rng(1)
    drawn = []
    for i in range(5):  # the store keeps 5: each is put, read back and fed back
        ev = Evidence.of(KEY, 1, rng.normal(size=3), rng.random(size=(2, 3)))
        assert online.put_evidence(f"same-{i}", ev)
        assert online.get_evidence(f"same-{i}").held_out == ev.held_out
        assert online.feedback(f"same-{i}", 0, True).held_out == ev.held_out
        drawn.append(ev.held_out)
    assert online.snapshot(KEY, 2).holdout_count == sum(drawn)
    # one id, many draws: the share is the server's 1 in 5, whatever the id
    share = np.mean(
        [Evidence.of(KEY, 1, np.zeros(3), np.ones((2, 3))).held_out for _ in range(4000)]
    )
    assert 0.17 < share < 0.23  # binomial(4000, 0.2): sd 0.0063, so this is > 4.7 sd
