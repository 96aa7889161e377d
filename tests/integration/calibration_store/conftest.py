"""Fixtures of the store tests: a fresh store of every backend, Redis stores under a
prefix unique to each test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from calibration_store import (
    ProfileStore,
    open_store,
)
from calibration_store.redis_store import RedisProfileStore
from tests.conftest import REDIS_URL, unique_key_prefix


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
    prefix = unique_key_prefix()

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
