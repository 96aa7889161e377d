"""HTTP test fixtures: a real tiny Qwen2.5-VL runner, apps built by create_app, world images.

One tiny runner is shared by every app of the session (its forward is thread-safe); each
test gets fresh apps, so metrics, stores and queues never leak between tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
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
from tests.api.helpers import calibration_body

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
