"""Fixtures shared by every test package: the real Redis server the Redis tests talk to.

Redis tests (marked ``redis``) use LAD_TEST_REDIS_URL (default redis://127.0.0.1:6379/15)
with a key prefix unique to each test, removed afterwards. Without a Redis answering
there they are skipped with the reason, unless CI is set: CI must run them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

REDIS_URL = os.environ.get("LAD_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def _redis_answers(url: str) -> bool:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    needs_redis = [item for item in items if "redis" in item.keywords]
    if not needs_redis or os.environ.get("CI") or _redis_answers(REDIS_URL):
        return
    skip = pytest.mark.skip(
        reason=f"no Redis answers at {REDIS_URL} (set LAD_TEST_REDIS_URL or start "
        "redis-server; CI=1 turns this skip into a failure)"
    )
    for item in needs_redis:
        item.add_marker(skip)


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A key prefix unique to the test; every key under it is removed afterwards."""
    import redis

    prefix = f"lad-test-{uuid.uuid4().hex[:10]}"
    yield prefix
    client = redis.Redis.from_url(REDIS_URL)
    try:
        for name in client.scan_iter(match=f"{prefix}:*"):
            client.delete(name)
    finally:
        client.close()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Sweep what test replicas still running at a prefix's cleanup wrote back (a replica
    that finds its Redis emptied republishes its version high-water marks and an epoch)."""
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1, socket_timeout=1)
    try:
        for name in client.scan_iter(match="lad-test-*"):
            client.delete(name)
    except redis.RedisError:
        pass  # no Redis here: nothing was written
    finally:
        client.close()
