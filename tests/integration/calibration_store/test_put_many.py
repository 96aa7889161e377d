"""put_many (one profile version per N, design §2.9): all or none on every backend, under a
real failure: a disk write that fails half-way or a crash with a half-applied batch (file),
a Redis that refuses writes or is gone (its own redis-server)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import calibration_store.local as local
from calibration_store import FileProfileStore, Profile, ProfileStore, StoreUnavailable
from calibration_store.redis_store import RedisProfileStore, encode_key
from tests.api.test_redis_faults import RedisServer, _free_port, redis_server  # noqa: F401
from tests.integration.calibration_store.stores import make_profile


def batch(seed: int, sizes: tuple[int, ...] = (2, 3, 4)) -> list[Profile]:
    return [make_profile(n=n, seed=seed + n) for n in sizes]


def current(store: ProfileStore, profiles: list[Profile]) -> list[int | None]:
    found = [store.get(p.key) for p in profiles]
    return [None if p is None else p.version for p in found]


def test_put_many_versions_every_key(make_store: Callable[..., ProfileStore]) -> None:
    store = make_store()
    first = store.put_many(batch(0))
    assert [p.version for p in first] == [1, 1, 1]
    store.put(make_profile(n=3, seed=99))  # one key moves ahead on its own
    second = store.put_many(batch(10))
    assert [(p.n, p.version) for p in second] == [(2, 2), (3, 3), (4, 2)]
    assert current(store, second) == [2, 3, 2]
    assert store.get(second[1].key).bias_matrix == second[1].bias_matrix
    with pytest.raises(ValueError, match="distinct keys"):
        store.put_many([make_profile(n=2), make_profile(n=2, seed=1)])
    with pytest.raises(ValueError):
        store.put_many([])


def test_file_write_failing_half_way_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "profiles"
    store = FileProfileStore(root)
    before = store.put_many(batch(0))
    real, calls = local.atomic_write, []

    def disk_full_on_third(path: Path, data: bytes) -> None:
        calls.append(path.name)
        if len(calls) == 3:  # journal, first document, then the disk fills up
            raise OSError(28, "No space left on device")
        real(path, data)

    monkeypatch.setattr(local, "atomic_write", disk_full_on_third)
    with pytest.raises(StoreUnavailable, match="No space left"):
        store.put_many(batch(10))
    monkeypatch.setattr(local, "atomic_write", real)
    assert calls[0].endswith(".undo") and len(calls) >= 3
    assert current(store, before) == [1, 1, 1]
    assert not list(root.glob("*.undo"))
    reopened = FileProfileStore(root)  # what disk holds: the first document was undone
    assert current(reopened, before) == [1, 1, 1]
    assert [store.get(p.key).bias_matrix for p in before] == [p.bias_matrix for p in before]
    assert [reopened.get(p.key).bias_matrix for p in before] == [p.bias_matrix for p in before]
    # the undone version 2 of the first key is never handed out again
    assert [p.version for p in reopened.put_many(batch(20))] == [3, 2, 2]


def test_file_crash_half_way_is_undone_at_the_next_open(tmp_path: Path) -> None:
    """A crash after the journal and some new documents: the next open restores the old ones."""
    root = tmp_path / "profiles"
    store = FileProfileStore(root)
    before = store.put_many(batch(0, sizes=(2, 3)))
    new_key = make_profile(n=4).key
    old: dict[str, str | None] = {
        local._file_name(p.key): (root / local._file_name(p.key)).read_text() for p in before
    }
    old[local._file_name(new_key)] = None  # the batch also created a new key
    store.put(make_profile(n=2, seed=7))  # the documents the crashed batch had written
    store.put(make_profile(n=4, seed=8))
    (root / "batch-crashed.undo").write_text(json.dumps(old))
    reopened = FileProfileStore(root)
    assert current(reopened, before) == [1, 1]
    assert reopened.get(new_key) is None
    assert reopened.get(before[0].key).bias_matrix == before[0].bias_matrix
    assert not list(root.glob("*.undo")) and reopened.health()["errors"] == []
    assert reopened.put(make_profile(n=2, seed=9)).version == 3  # the high-water mark holds


@pytest.fixture
def own_redis(redis_server: RedisServer) -> Iterator[tuple[RedisServer, redis.Redis]]:  # noqa: F811
    redis_server.start()
    admin = redis.Redis(port=redis_server.port)
    yield redis_server, admin
    admin.close()


def _redis_store(server: RedisServer) -> RedisProfileStore:
    return RedisProfileStore(server.url, key_prefix="lad", listen=False, socket_timeout=1.0)


@pytest.mark.slow
def test_redis_refusing_writes_stores_none(own_redis: Any) -> None:
    server, admin = own_redis
    store = _redis_store(server)
    before = store.put_many(batch(0))
    admin.config_set("min-replicas-to-write", 1)  # a live Redis that refuses every write
    with pytest.raises(StoreUnavailable, match=r"NOREPLICAS|replica"):
        store.put_many(batch(10, sizes=(2, 3, 4, 5)))
    admin.config_set("min-replicas-to-write", 0)
    fresh = _redis_store(server)  # what every replica reads from Redis itself
    assert current(fresh, before) == [1, 1, 1] == current(store, before)
    assert fresh.get(make_profile(n=5).key) is None
    counters = [f"lad:counter:{encode_key(p.key)}" for p in before]
    assert admin.mget(counters) == [b"1", b"1", b"1"]  # no version was burnt
    assert [p.version for p in store.put_many(batch(20))] == [2, 2, 2]
    store.close()
    fresh.close()


@pytest.mark.slow
def test_redis_gone_stores_none_and_recovers(own_redis: Any) -> None:
    server, _ = own_redis
    store = _redis_store(server)
    before = store.put_many(batch(0))
    server.kill()
    with pytest.raises(StoreUnavailable):
        store.put_many(batch(10))
    assert current(store, before) == [1, 1, 1]
    server.start()  # the append-only file brings the data back
    fresh = _redis_store(server)
    assert current(fresh, before) == [1, 1, 1]
    assert [p.version for p in fresh.put_many(batch(20))] == [2, 2, 2]
    store.close()
    fresh.close()
