"""Degraded, not down: the service on its own redis-server (own port), stopped and killed
while requests flow, started while Redis is down, and recovering without a restart."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from calibration_store.redis_store import RedisProfileStore
from tests.api.helpers import metric_value, retrieve_body

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("redis-server") is None and not os.environ.get("CI"),
        reason="redis-server is not installed (CI installs it)",
    ),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    """A redis-server of the test's own, persisted with an fsync'ed append-only file."""

    def __init__(self, port: int, directory: Path) -> None:
        self.port, self.dir = port, directory
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--dir",
                str(self.dir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                if client.ping():
                    break
            except redis.RedisError:
                assert time.monotonic() < deadline, "redis-server never answered"
                time.sleep(0.05)
        client.close()

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wipe(self) -> None:
        """Lose every key, as a restart without persistence does (call while stopped)."""
        assert self.proc is None
        for path in self.dir.iterdir():
            shutil.rmtree(path) if path.is_dir() else path.unlink()

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(_free_port(), tmp_path)
    yield server
    server.kill()


class Traffic:
    """Retrieval requests in a loop on a thread, every status recorded."""

    def __init__(self, client: Any, body: dict[str, Any]) -> None:
        self.client, self.body = client, body
        self.statuses: list[int] = []
        self.versions: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            r = self.client.post("/v1/retrieve", json=self.body)
            self.statuses.append(r.status_code)
            if r.status_code == 200:
                self.versions.append(r.json()["profile"]["version"])
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def _timed(call: Any) -> tuple[Any, float]:
    start = time.monotonic()
    result = call()
    return result, time.monotonic() - start


def _wait_for(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "not true in time"
        time.sleep(0.05)


def _admin_is_503_fast(client: Any) -> None:
    response, seconds = _timed(lambda: client.delete("/v1/profiles/other", params={"n": 3}))
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "store_unavailable"
    assert seconds < 3.0, seconds


def _ready_degraded(client: Any) -> None:
    ready = client.get("/readyz")
    assert ready.status_code == 200
    body = ready.json()
    assert body["status"] == "degraded" and body["store"]["status"] == "degraded"
    text = ready.text
    assert "Error" not in text and "127.0.0.1" not in text  # no Redis error strings leak


def test_stop_kill_restart_while_requests_flow(
    make_client, redis_server, items, calibrate_json, redis_prefix
):
    redis_server.start()
    client = make_client(
        store_url=redis_server.url, store_key_prefix=redis_prefix, store_poll_s=0.5
    )
    assert client.post("/v1/calibrate", json=calibrate_json).json()["version"] == 1
    traffic = Traffic(client, retrieve_body(items[0]))
    try:
        time.sleep(0.3)
        redis_server.signal(signal.SIGSTOP)  # hangs: connections open, no replies
        _admin_is_503_fast(client)
        _wait_for(lambda: client.get("/readyz").json()["status"] == "degraded", 5)
        _ready_degraded(client)
        time.sleep(1.0)
        redis_server.signal(signal.SIGCONT)
        redis_server.kill()  # gone: connections refused
        _admin_is_503_fast(client)
        _ready_degraded(client)
        time.sleep(1.0)
        redis_server.start()  # same port, same append-only file
        other = RedisProfileStore(redis_server.url, key_prefix=redis_prefix, listen=False)
        key = client.app.state.service.store.list_keys()[0]
        current = client.app.state.service.store.get(key)
        assert other.put(current).version == 2  # another replica, meanwhile
        other.close()
        _wait_for(lambda: traffic.versions and traffic.versions[-1] == 2, 15)
        _wait_for(lambda: client.get("/readyz").json()["status"] == "ok", 15)
        assert client.post("/v1/calibrate", json=calibrate_json).json()["version"] == 3
    finally:
        traffic.stop()
    assert len(traffic.statuses) > 20
    assert set(traffic.statuses) == {200}, sorted(set(traffic.statuses))


def test_starts_with_redis_down_and_recovers_without_a_restart(
    make_client, redis_server, items, calibrate_json, redis_prefix
):
    client = make_client(
        store_url=redis_server.url, store_key_prefix=redis_prefix, store_poll_s=0.5
    )  # nothing listens on that port yet
    _ready_degraded(client)
    r = client.post("/v1/retrieve", json=retrieve_body(items[0]))
    assert r.status_code == 409 and r.json()["error"]["code"] == "calibration_required"
    assert client.post("/v1/retrieve", json=retrieve_body(items[0], method="vanilla")).is_success
    response, seconds = _timed(lambda: client.post("/v1/calibrate", json=calibrate_json))
    assert response.status_code == 503 and seconds < 3.0
    _admin_is_503_fast(client)
    redis_server.start()
    _wait_for(lambda: client.get("/readyz").json()["status"] == "ok", 15)
    assert client.post("/v1/calibrate", json=calibrate_json).json()["version"] == 1
    assert client.post("/v1/retrieve", json=retrieve_body(items[0])).json()["profile"] == {
        "name": "default",
        "version": 1,
    }


def test_profile_reads_answer_from_the_replica_while_redis_is_down(
    make_client, redis_server, calibrate_json, redis_prefix
):
    """GET /v1/profiles[/{name}] read what the replica holds, as retrieve does (issue 29);
    only the kept versions need the store, so the detail lists the current one."""
    redis_server.start()
    client = make_client(
        store_url=redis_server.url, store_key_prefix=redis_prefix, store_poll_s=0.5
    )
    for _ in range(2):
        assert client.post("/v1/calibrate", json=calibrate_json).is_success
    assert len(client.get("/v1/profiles/default").json()["entries"][0]["versions"]) == 2
    redis_server.kill()
    detail, seconds = _timed(lambda: client.get("/v1/profiles/default"))
    assert detail.status_code == 200, detail.text
    (entry,) = detail.json()["entries"]
    assert entry["current_version"] == 2 and [v["version"] for v in entry["versions"]] == [2]
    assert seconds < 3.0, seconds
    listed = client.get("/v1/profiles")
    assert listed.status_code == 200 and listed.json()["profiles"][0]["name"] == "default"
    assert client.get("/v1/profiles/nobody").status_code == 404
    _admin_is_503_fast(client)


def test_redis_restarted_empty_never_reuses_a_version(
    make_client, redis_server, items, calibrate_json, redis_prefix
):
    """Redis comes back without its data: the replica follows it (no cached v2 served beside
    an empty store) and no version number is handed out twice, by it or by a fresh replica."""
    redis_server.start()
    client = make_client(
        store_url=redis_server.url, store_key_prefix=redis_prefix, store_poll_s=0.5
    )
    versions = [
        client.post("/v1/calibrate", json=calibrate_json).json()["version"] for _ in range(2)
    ]
    assert versions == [1, 2]
    store = client.app.state.service.store
    (key,) = store.list_keys()
    served = store.get(key)
    redis_server.kill()
    redis_server.wipe()
    redis_server.start()
    body = retrieve_body(items[0])
    _wait_for(lambda: client.post("/v1/retrieve", json=body).status_code == 409, 15)
    assert store.health()["store_resets"] == 1
    fresh = RedisProfileStore(redis_server.url, key_prefix=redis_prefix, listen=False)
    versions.append(fresh.put(served).version)  # a replica that never saw v1 and v2
    fresh.close()
    versions.append(client.post("/v1/calibrate", json=calibrate_json).json()["version"])
    assert versions == [1, 2, 3, 4]
    _wait_for(
        lambda: (
            client.post("/v1/retrieve", json=body).json()["profile"]
            == {"name": "default", "version": 4}
        ),
        5,
    )


def _writes(client: Any) -> tuple[int, dict[str, Any]]:
    ready = client.get("/readyz")
    return ready.status_code, ready.json()


def _metric(client: Any, name: str, **labels: str) -> float | None:
    return metric_value(client.get("/metrics").text, name, **labels)


@pytest.mark.parametrize(
    "refusal",
    [
        {"maxmemory-policy": "noeviction", "maxmemory": "1"},  # Redis at maxmemory: OOM
        {"min-replicas-to-write": "1"},  # Redis refusing writes (NOREPLICAS), reads fine
    ],
)
def test_readiness_and_a_gauge_say_when_every_write_fails(
    make_client, redis_server, items, calibrate_json, redis_prefix, refusal
):
    redis_server.start()
    client = make_client(
        store_url=redis_server.url, store_key_prefix=redis_prefix, store_poll_s=0.5
    )
    assert client.post("/v1/calibrate", json=calibrate_json).status_code == 200
    status, body = _writes(client)
    assert status == 200 and body["status"] == "ok" and body["store"]["writes"] == "ok"
    admin = redis.Redis(port=redis_server.port)
    for name, value in refusal.items():
        admin.config_set(name, value)
    time.sleep(1.2)  # polls keep succeeding: reads are fine
    r = client.post("/v1/calibrate", json=calibrate_json)
    assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"
    status, body = _writes(client)
    assert status == 200 and body["ready"] is True  # retrieval still works: stays ready
    assert body["status"] == "degraded" and body["store"]["status"] == "degraded"
    assert body["store"]["writes"] == "failing" and body["store"]["connected"] is True
    assert "OOM" not in str(body) and "NOREPLICAS" not in str(body)  # no error strings
    assert _metric(client, "lad_store_writes_failing") == 1
    assert _metric(client, "lad_store_degraded") == 0
    assert client.post("/v1/retrieve", json=retrieve_body(items[0])).status_code == 200
    admin.config_set("maxmemory", "0")
    admin.config_set("min-replicas-to-write", "0")
    admin.close()
    assert client.post("/v1/calibrate", json=calibrate_json).json()["version"] == 2
    assert _writes(client)[1]["store"]["writes"] == "ok"
    assert _metric(client, "lad_store_writes_failing") == 0


def test_readiness_finds_failing_writes_without_a_write_by_its_probe(
    make_client, redis_server, calibrate_json, redis_prefix
):
    """No admin write happens: the readiness probe's own write finds the refusal."""
    redis_server.start()
    client = make_client(store_url=redis_server.url, store_key_prefix=redis_prefix)
    assert client.post("/v1/calibrate", json=calibrate_json).status_code == 200
    admin = redis.Redis(port=redis_server.port)
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", "1")
    _wait_for(lambda: _writes(client)[1]["store"]["writes"] == "failing", 12)
    assert _metric(client, "lad_store_errors_total", operation="write_probe") >= 1
    admin.config_set("maxmemory", "0")
    _wait_for(lambda: _writes(client)[1]["store"]["writes"] == "ok", 12)
    admin.close()


# ---------------------------------------------------------------- Redis off the request path
def test_a_cached_profile_retrieve_never_waits_on_a_stalled_redis(
    make_client, redis_server, items, calibrate_json, redis_prefix
):
    """The evidence write is queued (issue 41 item 6): with Redis stopped (SIGSTOP: the
    socket open, no replies for the 2 s timeout) agd retrieves answer at their usual speed,
    and the writes that could not wait are dropped and counted."""
    redis_server.start()
    client = make_client(store_url=redis_server.url, store_key_prefix=redis_prefix)
    assert client.post("/v1/calibrate", json=calibrate_json).status_code == 200
    body = retrieve_body(items[0])
    _, usual = _timed(lambda: client.post("/v1/retrieve", json=body))
    redis_server.signal(signal.SIGSTOP)
    try:
        for _ in range(4):
            response, seconds = _timed(lambda: client.post("/v1/retrieve", json=body))
            assert response.status_code == 200, response.text
            assert seconds < usual + 1.0, (seconds, usual)
        # one write waits its 2 s timeout and fails; the three queued behind it are
        # dropped with it (paused), not written one timeout each
        _wait_for(lambda: _dropped(client) >= 4, 6)
        assert _metric(client, "lad_store_writes_dropped_total", reason="store_error") == 1
    finally:
        redis_server.signal(signal.SIGCONT)


def _dropped(client: Any) -> float:
    return sum(
        _metric(client, "lad_store_writes_dropped_total", reason=reason) or 0
        for reason in ("queue_full", "store_error", "paused")
    )


def test_feedback_for_a_retrieve_made_while_redis_was_read_only_is_503(
    make_client, redis_server, items, calibrate_json, redis_prefix
):
    """A read-only Redis (a replica of a master that is not there) keeps the request's
    evidence out: its feedback says so, 503 with the store's reason, not 404."""
    redis_server.start()
    client = make_client(store_url=redis_server.url, store_key_prefix=redis_prefix)
    assert client.post("/v1/calibrate", json=calibrate_json).status_code == 200
    admin = redis.Redis(port=redis_server.port)
    admin.config_set("replica-read-only", "yes")
    admin.execute_command("REPLICAOF", "127.0.0.1", str(_free_port()))
    try:
        retrieved = client.post("/v1/retrieve", json=retrieve_body(items[0]))
        assert retrieved.status_code == 200
        request_id = retrieved.json()["request_id"]
        feedback = client.post("/v1/feedback", json={"request_id": request_id, "answer": 0})
        assert feedback.status_code == 503, feedback.text
        error = feedback.json()["error"]
        assert error["code"] == "store_unavailable" and "read only" in error["message"]
        assert _metric(client, "lad_store_writes_dropped_total", reason="store_error") == 1
        unknown = client.post("/v1/feedback", json={"request_id": "never-served", "answer": 0})
        assert unknown.status_code == 404  # an id this replica never dropped: still unknown
    finally:
        admin.execute_command("REPLICAOF", "NO", "ONE")
        admin.close()


def test_a_wrong_password_is_retried_with_backoff(make_client, redis_server, caplog):
    """Degraded start as documented, then reconnection attempts spaced by an exponential
    backoff with jitter, one warning each: 0.5 s apart on main (about 16 in 8 s)."""
    redis_server.start()
    admin = redis.Redis(port=redis_server.port)
    admin.config_set("requirepass", "right")
    admin.close()
    with caplog.at_level(logging.WARNING, logger="calibration_store"):
        client = make_client(store_url=redis_server.url, store_poll_s=0.5)
        assert client.get("/readyz").json()["store"]["status"] == "degraded"
        time.sleep(8)
    lost = [r for r in caplog.records if r.name == "calibration_store.redis_listener"]
    assert 3 <= len(lost) <= 6, [r.getMessage() for r in lost]
    waits = [float(r.getMessage().split("reconnecting in ")[1].split(" s")[0]) for r in lost]
    assert waits == sorted(waits) and waits[-1] >= 2 * waits[0], waits
