"""Redis stores: replicas that see each other's writes (pub/sub, polling, reconnects),
versions that never go backwards under interleaved writers, the file store's high-water
mark. Keys live under a prefix unique to each test (LAD_TEST_REDIS_URL)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from calibration_store import (
    FileProfileStore,
    StoreCorrupt,
    StoreUnavailable,
    UnknownSchemaVersion,
)
from calibration_store.redis_store import RedisProfileStore
from tests.conftest import REDIS_URL
from tests.integration.calibration_store.stores import make_profile, wait_for


# ------------------------------------------------------------ Redis replicas
@pytest.mark.redis
def test_replicas_see_put_rollback_delete_via_pubsub(
    open_redis: Callable[..., RedisProfileStore],
) -> None:
    a = open_redis(poll_interval=3600)  # no polling: only pub/sub can deliver in time
    b = open_redis(poll_interval=3600)
    key = make_profile().key
    first = a.put(make_profile())
    assert wait_for(lambda: b.get(key) == first) < 2
    second = a.put(make_profile(seed=1))
    wait_for(lambda: b.get(key) == second, timeout=5)
    a.rollback(key)
    wait_for(lambda: b.get(key) == first)
    third = b.put(make_profile(seed=2))  # and the other way round
    wait_for(lambda: a.get(key) == third)
    assert b.list_keys() == a.list_keys() == [key]
    a.delete(key)
    wait_for(lambda: b.get(key) is None and b.list_keys() == [])


@pytest.mark.redis
def test_replica_catches_up_on_resubscribe_after_missed_messages(
    open_redis: Callable[..., RedisProfileStore],
) -> None:
    a = open_redis(poll_interval=3600)
    b = open_redis(poll_interval=3600)
    key = make_profile().key
    first = a.put(make_profile())
    wait_for(lambda: b.get(key) == first)
    b.stop_listener()
    second = a.put(make_profile(seed=1))
    other = a.put(make_profile(n=3))
    time.sleep(0.3)
    assert b.get(key) == first and b.get(other.key) is None  # the messages were missed
    b.start_listener()
    wait_for(lambda: b.get(key) == second and b.get(other.key) == other)


@pytest.mark.redis
def test_replica_catches_up_by_polling_without_messages(
    open_redis: Callable[..., RedisProfileStore],
    redis_prefix: str,
) -> None:
    a = open_redis()
    b = open_redis(poll_interval=0.3, listen=False)
    b.channel = f"{redis_prefix}:a-channel-nobody-publishes-on"
    b.start_listener()
    key = make_profile().key
    stored = a.put(make_profile())
    wait_for(lambda: b.get(key) == stored)
    a.delete(key)
    wait_for(lambda: b.get(key) is None)


@pytest.mark.redis
def test_replica_recovers_after_its_connection_is_killed(
    open_redis: Callable[..., RedisProfileStore],
) -> None:
    a = open_redis(poll_interval=3600)
    b = open_redis(poll_interval=3600)
    wait_for(lambda: b.subscriptions >= 1)
    admin = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    name = f"lad-store-{b.instance_id}"
    (sub,) = [c for c in admin.client_list() if c["name"] == name and "P" in c["flags"]]
    assert admin.client_kill_filter(_id=sub["id"]) == 1  # only b's subscriber connection
    admin.close()
    stored = a.put(make_profile())
    wait_for(lambda: b.get(stored.key) == stored, timeout=5)
    wait_for(lambda: b.subscriptions >= 2 and b.health()["connected"], timeout=5)


@pytest.mark.redis
def test_redis_concurrent_puts_from_two_replicas(
    open_redis: Callable[..., RedisProfileStore],
) -> None:
    a, b = open_redis(), open_redis()
    results: list[int] = []
    barrier = threading.Barrier(10)

    def worker(i: int) -> None:
        barrier.wait()
        results.append((a if i % 2 else b).put(make_profile(seed=i)).version)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    key = make_profile().key
    assert sorted(results) == list(range(1, 11))
    assert a.versions(key) == [6, 7, 8, 9, 10]
    wait_for(lambda: a.get(key).version == b.get(key).version == 10)


@pytest.mark.redis
def test_redis_trims_documents_and_guards_schema(
    open_redis: Callable[..., RedisProfileStore],
    redis_prefix: str,
) -> None:
    store = open_redis(keep_versions=2)
    for s in range(4):
        store.put(make_profile(seed=s))
    admin = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    docs = sorted(admin.scan_iter(f"{redis_prefix}:profile:*"))
    assert [d.rsplit(":", 1)[1] for d in docs] == ["v3", "v4"]
    admin.set(docs[0], admin.get(docs[0]).replace('"schema_version":1', '"schema_version":2'))
    admin.close()
    with pytest.raises(StoreCorrupt) as info:  # the service answers 500 store_corrupt
        store.get_version(make_profile().key, 3)
    assert isinstance(info.value.__cause__, UnknownSchemaVersion)


@pytest.mark.redis
def test_a_replica_recovers_a_profile_that_vanished_for_a_moment(
    open_redis: Callable[..., RedisProfileStore],
    redis_prefix: str,
) -> None:
    """An eviction (shared Redis, allkeys-lru) or a restore takes a key away and brings it
    back unchanged, after other keys moved the change sequence past the key's own rev."""
    from calibration_store.redis_store import encode_key

    a, b = open_redis(), open_redis(poll_interval=0.2)
    key = make_profile().key
    first = a.put(make_profile())
    a.put(make_profile("other"))
    wait_for(lambda: b.get(key) == first)
    admin = redis.Redis.from_url(REDIS_URL)
    enc = encode_key(key)
    doc, pointer = f"{redis_prefix}:profile:{enc}:v1", f"{redis_prefix}:current:{enc}"
    saved = admin.dump(doc)
    admin.delete(doc)  # the document alone: the copy keeps serving, the gap is reported
    wait_for(lambda: enc in b.health()["errors"])
    assert b.get(key) == first
    admin.restore(doc, 0, saved)
    wait_for(lambda: enc not in b.health()["errors"])
    saved = admin.dump(pointer)
    admin.delete(pointer)  # the pointer: gone as if deleted
    wait_for(lambda: b.get(key) is None)
    admin.restore(pointer, 0, saved)  # repaired: picked up by the next poll, by itself
    wait_for(lambda: b.get(key) == first, timeout=2)
    assert b.store_resets == 0
    admin.close()


def test_file_store_says_when_writes_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file size limit of 0 refuses every byte written, as a full disk does: the failed put
    and then the probe say so; reads keep serving."""
    import resource
    import signal

    import calibration_store.base as base

    monkeypatch.setattr(base, "WRITE_PROBE_EVERY_S", 0.0)
    store = FileProfileStore(tmp_path)
    stored = store.put(make_profile())
    assert store.health()["writes"] == "ok" and store.check_writes() is True
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
    try:
        with pytest.raises(StoreUnavailable):
            store.put(make_profile(seed=1))
        failed_put = store.health()["writes"]
        probe = store.check_writes()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert failed_put == "failing" and probe is False
    assert "File too large" in store.health()["last_write_error"]
    assert store.get(stored.key) == stored and not list(tmp_path.glob(".probe.*"))
    assert store.check_writes() is True and store.health()["writes"] == "ok"


# ------------------------------------------------------- versions never go backwards
class _Interleaved:
    """Wraps a store's commit script so that `before()` runs between the put's version
    allocation (its read of the counter) and its commit: the interleaving to force."""

    def __init__(self, store: RedisProfileStore, before: Callable[[], None]) -> None:
        self.store, self.before, self.inner = store, before, store._commit
        self.calls = 0

    def __call__(self, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            self.before()
        return self.inner(**kwargs)


@pytest.mark.redis
def test_redis_delete_between_allocation_and_commit_cannot_restart_versions(
    open_redis: Callable[..., RedisProfileStore],
) -> None:
    a, b = open_redis(), open_redis()
    key = make_profile().key
    assert [a.put(make_profile(seed=s)).version for s in range(3)] == [1, 2, 3]
    a._commit = _Interleaved(a, lambda: b.delete(key))  # type: ignore[method-assign]
    stored = a.put(make_profile(seed=7))  # allocated 4, then the delete landed, then commit
    assert a._commit.calls == 1 and stored.version == 4
    assert a.versions(key) == [4] and a.get(key) == stored
    assert b.put(make_profile(seed=8)).version == 5  # still increasing after the delete
    b.delete(key)
    assert a.put(make_profile(seed=9)).version == 6


@pytest.mark.redis
def test_redis_concurrent_put_between_allocation_and_commit_retries_with_the_next_version(
    open_redis: Callable[..., RedisProfileStore],
) -> None:
    a, b = open_redis(), open_redis()
    key = make_profile().key
    a._commit = _Interleaved(a, lambda: b.put(make_profile(seed=1)))  # type: ignore[method-assign]
    stored = a.put(make_profile(seed=2))  # its version 1 was taken by b: commit retried as 2
    assert a._commit.calls == 2 and stored.version == 2
    assert a.versions(key) == [1, 2] and a.get(key) == stored


@pytest.mark.redis
def test_redis_failed_commit_burns_no_version(
    open_redis: Callable[..., RedisProfileStore],
) -> None:
    store = open_redis()
    key = make_profile().key
    store.put(make_profile(seed=1))
    real = store._commit

    def times_out(**kwargs: Any) -> Any:
        raise redis.TimeoutError("Timeout reading from socket")

    store._commit = times_out  # type: ignore[method-assign]
    with pytest.raises(StoreUnavailable):
        store.put(make_profile(seed=2))
    store._commit = real  # type: ignore[method-assign]
    assert store.put(make_profile(seed=3)).version == 2  # 2 was not burned
    assert store.versions(key) == [1, 2]


def test_file_store_high_water_mark_survives_reopen(tmp_path: Path) -> None:
    store = FileProfileStore(tmp_path)
    key = make_profile().key
    for s in range(3):
        store.put(make_profile(seed=s))
    assert store.delete(key) is True
    store.close()
    again = FileProfileStore(tmp_path)
    assert again.get(key) is None and again.list_keys() == [] and again.versions(key) == []
    assert again.health()["profiles"] == 0
    assert again.put(make_profile(seed=5)).version == 4
    again.close()
