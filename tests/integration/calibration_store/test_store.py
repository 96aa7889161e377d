"""Calibration stores against their real backends: memory, files on disk, a real Redis.

Redis tests use LAD_TEST_REDIS_URL (default redis://127.0.0.1:6379/15) with a key
prefix unique to each test, removed afterwards.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from calibration_store import (
    FileProfileStore,
    NoPreviousVersion,
    Profile,
    ProfileKey,
    ProfileNotFound,
    ProfileStore,
    StoreCorrupt,
    StoreUnavailable,
    UnknownSchemaVersion,
    open_store,
)
from calibration_store.redis_store import RedisProfileStore
from tests.conftest import REDIS_URL


def make_profile(
    name: str = "default",
    *,
    n: int = 4,
    model_id: str = "org/model:v1",
    labels: str = "digits",
    seed: int = 0,
) -> Profile:
    rng = np.random.default_rng(seed)
    return Profile.create(
        name=name,
        fingerprint={
            "model_id": model_id,
            "model_revision": "abc123",
            "dtype": "float32",
            "attention_backend": "sdpa",
            "prompt_hash": "p" * 16,
            "label_scheme": labels,
            "n": n,
        },
        layers=[3, 4],
        bias_matrix=rng.normal(size=(n, n)),
        attention_prior=rng.random(size=(2, n)),
        num_examples=5,
        num_forward_passes=5 * n,
        hyperparameters={"top_k": 2, "tau": 5.0, "variant": "reference", "seed": seed},
    )


def wait_for(predicate: Callable[[], bool], timeout: float = 2.0) -> float:
    """Poll `predicate` (a cache read, never a forced backend read); returns seconds waited."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(0.01)
    return time.monotonic() - start


@pytest.fixture
def open_redis(redis_prefix: str) -> Iterator[Callable[..., RedisProfileStore]]:
    opened: list[RedisProfileStore] = []

    def factory(**kwargs: Any) -> RedisProfileStore:
        kwargs.setdefault("key_prefix", redis_prefix)
        store = RedisProfileStore(REDIS_URL, **kwargs)
        opened.append(store)
        return store

    yield factory
    for store in opened:
        store.close()


@pytest.fixture(params=["memory", "file", pytest.param("redis", marks=pytest.mark.redis)])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Factory of a fresh store of each backend, e.g. make_store(keep_versions=3)."""
    opened: list[ProfileStore] = []
    prefix = f"lad-test-{uuid.uuid4().hex[:10]}"

    def factory(**kwargs: Any) -> ProfileStore:
        url = {"memory": "memory://", "file": str(tmp_path / "profiles"), "redis": REDIS_URL}[
            request.param
        ]
        if request.param == "redis":
            kwargs.setdefault("key_prefix", prefix)
        store = open_store(url, **kwargs)
        opened.append(store)
        return store

    yield factory
    for store in opened:
        store.close()
    if request.param == "redis":
        client = redis.Redis.from_url(REDIS_URL)
        for name in client.scan_iter(f"{prefix}:*"):
            client.delete(name)
        client.close()


# ------------------------------------------------------------------ every backend
def test_put_get_versions_rollback_delete(make_store: Callable[..., ProfileStore]) -> None:
    store = make_store()
    assert isinstance(store, ProfileStore)
    key = make_profile().key
    assert store.get(key) is None and store.versions(key) == []
    stored = [store.put(make_profile(seed=s)) for s in range(3)]
    assert [p.version for p in stored] == [1, 2, 3]
    assert store.get(key) == stored[2]
    assert store.versions(key) == [1, 2, 3]
    assert store.get_version(key, 2) == stored[1]
    assert store.get_version(key, 9) is None

    assert store.rollback(key).version == 2
    assert store.get(key) == stored[1]
    assert store.rollback(key).version == 1
    with pytest.raises(NoPreviousVersion):
        store.rollback(key)
    assert store.rollback(key, to_version=3) == stored[2]
    with pytest.raises(ProfileNotFound):
        store.rollback(key, to_version=7)
    assert store.versions(key) == [1, 2, 3]  # rollback moves the pointer, deletes nothing

    assert store.put(make_profile(seed=9)).version == 4  # after last allocated, not current+1
    assert store.delete(key) is True
    assert store.get(key) is None and store.versions(key) == [] and store.list_keys() == []
    assert store.delete(key) is False
    with pytest.raises(ProfileNotFound):
        store.rollback(key)
    # the high-water mark survives delete: a version number never names two calibrations
    assert store.put(make_profile()).version == 5
    assert store.versions(key) == [5] and store.list_keys() == [key]


def test_stored_copy_is_exact_and_stamped(make_store: Callable[..., ProfileStore]) -> None:
    store = make_store()
    profile = make_profile(seed=4)
    before = time.time()
    stored = store.put(profile)
    assert profile.version == 0 and profile.created_at is None  # input untouched
    assert stored.version == 1 and stored.created_at is not None
    assert stored.created_at.utcoffset() is not None and stored.created_at.utcoffset().seconds == 0
    assert before - 1 <= stored.created_at.timestamp() <= time.time() + 1
    fetched = store.get_version(profile.key, 1)
    assert fetched == stored
    assert np.array_equal(fetched.bias_matrix_array(), profile.bias_matrix_array())
    assert fetched.hyperparameters == profile.hyperparameters


def test_keys_per_model_name_labels_and_n(make_store: Callable[..., ProfileStore]) -> None:
    store = make_store()
    profiles = [
        make_profile(),
        make_profile(n=5),
        make_profile(labels="upper"),
        make_profile("strict"),
        make_profile(model_id="other/model"),
    ]
    for p in profiles:
        store.put(p)
    assert set(store.list_keys()) == {p.key for p in profiles}
    assert {k.model_id for k in store.list_keys("other/model")} == {"other/model"}
    assert len(store.list_keys("org/model:v1")) == 4
    assert store.get(make_profile(n=5).key).n == 5
    assert (
        store.get(ProfileKey(model_id="org/model:v1", name="default", label_scheme="digits", n=6))
        is None
    )


def test_trimming_keeps_last_k(make_store: Callable[..., ProfileStore]) -> None:
    store = make_store(keep_versions=3)
    key = make_profile().key
    for s in range(5):
        store.put(make_profile(seed=s))
    assert store.versions(key) == [3, 4, 5]
    assert store.get_version(key, 2) is None
    with pytest.raises(ProfileNotFound):
        store.rollback(key, to_version=1)
    store.rollback(key)
    store.rollback(key)
    with pytest.raises(NoPreviousVersion):
        store.rollback(key)
    assert store.put(make_profile(seed=7)).version == 6
    assert store.versions(key) == [4, 5, 6]


def test_concurrent_puts_get_distinct_consecutive_versions(
    make_store: Callable[..., ProfileStore],
) -> None:
    store = make_store()
    results: list[int] = []
    barrier = threading.Barrier(8)

    def worker(seed: int) -> None:
        barrier.wait()
        results.append(store.put(make_profile(seed=seed)).version)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == list(range(1, 9))
    key = make_profile().key
    assert store.get(key).version == 8
    assert store.versions(key) == [4, 5, 6, 7, 8]


# ------------------------------------------------------------------------ URLs
def test_open_store_urls(tmp_path: Path) -> None:
    assert type(open_store("memory://")).__name__ == "MemoryProfileStore"
    by_uri = open_store(f"file://{tmp_path}/a")
    assert isinstance(by_uri, FileProfileStore) and by_uri.root == tmp_path / "a"
    by_path = open_store(tmp_path / "b")
    assert isinstance(by_path, FileProfileStore) and (tmp_path / "b").is_dir()
    for bad in ("s3://bucket/x", "", "file://otherhost/x", "file://"):
        with pytest.raises(ValueError):
            open_store(bad)


@pytest.mark.redis
def test_unreachable_redis_opens_degraded_and_fails_fast() -> None:
    """Redis down at start-up: the store opens (empty, not ok); calls that need Redis raise
    StoreUnavailable quickly instead of stalling."""
    start = time.monotonic()
    store = open_store("redis://127.0.0.1:1/0", socket_timeout=0.5, listen=False)
    try:
        assert store.health()["ok"] is False and store.list_keys() == []
        assert store.get(make_profile().key) is None
        for call in (
            lambda: store.put(make_profile()),
            lambda: store.delete(make_profile().key),
            lambda: store.versions(make_profile().key),
        ):
            with pytest.raises(StoreUnavailable):
                call()
    finally:
        store.close()
    assert time.monotonic() - start < 5


# ------------------------------------------------------------------- file store
def test_file_store_survives_reopen(tmp_path: Path) -> None:
    store = FileProfileStore(tmp_path, keep_versions=3)
    stored = [store.put(make_profile(seed=s)) for s in range(4)]
    store.put(make_profile(n=2))
    store.rollback(stored[0].key)
    store.close()

    again = FileProfileStore(tmp_path, keep_versions=3)
    key = stored[0].key
    assert again.get(key) == stored[2]
    assert again.versions(key) == [2, 3, 4]
    assert again.get_version(key, 4) == stored[3]
    assert len(again.list_keys()) == 2
    assert again.put(make_profile()).version == 5
    assert again.health()["errors"] == []


def test_file_store_failed_replace_leaves_old_document(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileProfileStore(tmp_path)
    first = store.put(make_profile())
    (doc,) = tmp_path.glob("*.json")
    before = doc.read_bytes()

    def crash(src: Any, dst: Any) -> None:
        raise OSError("simulated crash between write and rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(StoreUnavailable):
        store.put(make_profile(seed=1))
    monkeypatch.undo()
    assert doc.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", doc.name]
    assert store.get(first.key) == first and store.versions(first.key) == [1]
    assert FileProfileStore(tmp_path).get(first.key) == first


def test_file_store_half_written_temp_is_ignored_and_removed(tmp_path: Path) -> None:
    store = FileProfileStore(tmp_path)
    first = store.put(make_profile())
    (doc,) = tmp_path.glob("*.json")
    leftover = tmp_path / f".{doc.name}.x1y2.tmp"  # what a writer killed mid-write leaves
    leftover.write_bytes(doc.read_bytes()[: len(doc.read_bytes()) // 2])
    again = FileProfileStore(tmp_path)
    assert again.get(first.key) == first
    assert not leftover.exists()


def test_file_store_reports_unknown_schema_and_never_clobbers(tmp_path: Path) -> None:
    store = FileProfileStore(tmp_path)
    store.put(make_profile())
    (doc,) = tmp_path.glob("*.json")
    doc.write_text(doc.read_text().replace('"schema_version":1', '"schema_version":99'))
    newer = doc.read_bytes()
    reopened = FileProfileStore(tmp_path)
    assert reopened.get(make_profile().key) is None
    (error,) = reopened.health()["errors"]
    assert "schema_version 99" in error
    with pytest.raises(UnknownSchemaVersion):
        reopened.put(make_profile())
    assert doc.read_bytes() == newer


def test_two_file_stores_on_one_directory_never_lose_a_version(tmp_path: Path) -> None:
    a, b = FileProfileStore(tmp_path), FileProfileStore(tmp_path)
    assert a.put(make_profile()).version == 1
    assert b.put(make_profile(seed=1)).version == 2  # re-read the document under the lock
    assert a.put(make_profile(seed=2)).version == 3
    assert FileProfileStore(tmp_path).versions(make_profile().key) == [1, 2, 3]


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
