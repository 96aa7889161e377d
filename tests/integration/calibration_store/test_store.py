"""Calibration stores against their real backends: memory, files on disk, a real Redis.

Redis tests use LAD_TEST_REDIS_URL (default redis://127.0.0.1:6379/15) with a key
prefix unique to each test, removed afterwards.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calibration_store import (
    FileProfileStore,
    NoPreviousVersion,
    ProfileKey,
    ProfileNotFound,
    ProfileStore,
    StoreUnavailable,
    UnknownSchemaVersion,
    open_store,
)
from tests.integration.calibration_store.stores import make_profile


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
