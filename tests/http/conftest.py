"""HTTP test fixtures: a real tiny Qwen2.5-VL runner, apps built by create_app, world images.

One tiny runner is shared by every app of the session (its forward is thread-safe); each
test gets fresh apps, so metrics, stores and queues never leak between tests.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from app.demo.world import RetrievalExample, make_items
from app.main import create_app
from app.settings import Settings
from app.testing.tiny_models import tiny_runner
from calibration_store import ProfileStore, open_store
from tests.http.helpers import calibration_body

REDIS_URL = os.environ.get("LAD_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def runner() -> Any:
    return tiny_runner("qwen2_5_vl")


@pytest.fixture(scope="session")
def items() -> list[RetrievalExample]:
    """Evaluation-split items with N=3 candidates (56 px synthetic world images)."""
    return make_items(8, n_candidates=3, setting="random", seed="eval", image_size=56)


@pytest.fixture(scope="session")
def calibration_items() -> list[RetrievalExample]:
    return make_items(5, n_candidates=3, setting="random", seed="calibration", image_size=56)


@pytest.fixture(scope="session")
def calibrate_json(calibration_items: list[RetrievalExample]) -> dict[str, Any]:
    return calibration_body(calibration_items)


AppFactory = Callable[..., TestClient]


@pytest.fixture
def make_client(runner: Any) -> Iterator[AppFactory]:
    """`make_client(runner=..., store=..., **settings)` -> a started TestClient (closed after)."""
    with ExitStack() as stack:

        def factory(*, runner_override: Any = None, store: ProfileStore | None = None,
                    raise_server_exceptions: bool = True, **overrides: Any) -> TestClient:
            values: dict[str, Any] = {"store_url": "memory://", **overrides}
            settings = Settings(_env_file=None, **values)
            if store is None and values["store_url"] == "memory://":
                store = open_store("memory://")
            app = create_app(settings, runner=runner_override or runner, store=store)
            client = TestClient(app, raise_server_exceptions=raise_server_exceptions)
            stack.enter_context(client)
            return client

        yield factory


@pytest.fixture
def client(make_client: AppFactory) -> TestClient:
    return make_client()


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A key prefix unique to the test; every key under it is removed afterwards."""
    import redis

    prefix = f"lad-test-http-{uuid.uuid4().hex[:10]}"
    yield prefix
    conn = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(conn.scan_iter(match=f"{prefix}:*"))
        if keys:
            conn.delete(*keys)
    finally:
        conn.close()


class GatedRunner:
    """The real runner behind a gate: forward waits until the test opens it (queue tests)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.entered = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def forward(self, items: Sequence[Any], labels: Any = "digits") -> Any:
        self.entered.set()
        if not self.gate.wait(30):
            raise TimeoutError("gate never opened")
        return self.inner.forward(items, labels=labels)


class FaultyRunner:
    """The real runner, except that a query of "boom" makes forward raise (worker tests)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def forward(self, items: Sequence[Any], labels: Any = "digits") -> Any:
        if any(item.query == "boom" for item in items):
            raise RuntimeError("simulated failure inside the model")
        return self.inner.forward(items, labels=labels)
