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

from app.main import create_app
from app.settings import Settings
from calibration_store import ProfileStore, open_store
from lad_lab.demo.world import RetrievalExample, make_items
from tests.api.helpers import calibration_body

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def runner(shared_runner: Callable[..., Any]) -> Any:
    return shared_runner("qwen2_5_vl")


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

        def factory(
            *,
            runner_override: Any = None,
            store: ProfileStore | None = None,
            raise_server_exceptions: bool = True,
            **overrides: Any,
        ) -> TestClient:
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


class LiveServer:
    """`lad serve`'s uvicorn (same protocol class and options) in a thread, on a free port."""

    def __init__(self, app: Any, settings: Settings) -> None:
        import socket
        import threading

        import uvicorn

        from app.api.server import uvicorn_options

        self.app = app
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        options = {**uvicorn_options(settings), "log_level": "warning"}
        self.server = uvicorn.Server(uvicorn.Config(app, **options))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )
        self.thread.start()
        import time

        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "server never started"
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()


@pytest.fixture
def live_server(runner: Any) -> Iterator[Callable[..., LiveServer]]:
    """`live_server(runner_override=..., **settings)` -> a running LiveServer (stopped after)."""
    started: list[LiveServer] = []

    def factory(*, runner_override: Any = None, **overrides: Any) -> LiveServer:
        settings = Settings(_env_file=None, **{"store_url": "memory://", **overrides})
        app = create_app(settings, runner=runner_override or runner, store=open_store("memory://"))
        server = LiveServer(app, settings)
        started.append(server)
        return server

    yield factory
    for server in started:
        server.stop()
