"""Fixtures shared by every test package: the real Redis server the Redis tests talk to, and
one cache of loaded runners, so the suite builds each model once.

Redis tests (marked ``redis``) use LAD_TEST_REDIS_URL (default redis://127.0.0.1:6379/15)
with a key prefix unique to each test, removed afterwards. Without a Redis answering
there they are skipped with the reason, unless CI is set: CI must run them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

REDIS_URL = os.environ.get("LAD_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
SESSION_PREFIX = f"lad-test-{uuid.uuid4().hex[:6]}"
"""This session's key prefix: its sweep leaves another pytest session's keys alone."""


def unique_key_prefix() -> str:
    """A key prefix unique to one test, under this session's."""
    return f"{SESSION_PREFIX}-{uuid.uuid4().hex[:10]}"


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


def _key(model: str, options: dict[str, Any]) -> tuple[Any, ...]:
    """A hashable key of the runner's arguments (a list of layers is keyed as a tuple)."""
    return (model, *sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in options.items()))


@pytest.fixture(scope="session")
def shared_runner() -> Callable[..., Any]:
    """``shared_runner(model, **options)``: one runner per distinct arguments for the whole
    session. ``"demo"`` is the bundled demo model (``load_runner``, one torch thread); any
    other name is a tiny family of ``lad_lab.testing.tiny_models.tiny_runner`` with those options.

    Every test module that asks for the same arguments gets the same object, so a test must
    leave the runner as it found it (monkeypatch, or restore in ``finally``); a test that
    changes a runner for good builds its own with ``tiny_runner``. ``shared_runner.built(model,
    **options)`` is the runner already made for those arguments, or None (nothing is built:
    the model matrix checks another test's build where there is one, and keeps no other)."""
    import torch

    torch.set_num_threads(1)
    built: dict[tuple[Any, ...], Any] = {}

    def get(model: str = "qwen2_5_vl", **options: Any) -> Any:
        key = _key(model, options)
        if key not in built:
            if model == "demo":
                from app.models.loader import load_runner

                built[key] = load_runner("demo", threads=1, **options)
            else:
                from lad_lab.testing.tiny_models import tiny_runner

                built[key] = tiny_runner(model, **options)
        return built[key]

    def already(model: str = "qwen2_5_vl", **options: Any) -> Any:
        return built.get(_key(model, options))

    get.built = already  # type: ignore[attr-defined]
    return get


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A key prefix unique to the test; every key under it is removed afterwards."""
    import redis

    prefix = unique_key_prefix()
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
        for name in client.scan_iter(match=f"{SESSION_PREFIX}-*"):
            client.delete(name)
    except redis.RedisError:
        pass  # no Redis here: nothing was written
    finally:
        client.close()
