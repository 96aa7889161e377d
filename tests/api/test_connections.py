"""Connections and HTTP framing on a real server (uvicorn with `lad serve`'s protocol and
options): idle sockets cannot take the slots of real requests, a client that leaves
mid-body is counted as 499 (not a 5xx), and a request framed two ways (Content-Length and
Transfer-Encoding) or with an oversized head is refused in the envelope and closed."""

from __future__ import annotations

import json
import logging
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.api.helpers import retrieve_body
from tests.api.test_http_edge import Raw


def _count(server, name: str, **labels: str) -> float:
    return server.metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
def served(live_server, runner):
    def start(**settings):
        server = live_server(header_timeout_s=30.0, **settings)
        server.metrics = server.app.state.metrics
        return server

    return start


def _idle_sockets(port: int, count: int) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        socks.append(sock)
    time.sleep(0.3)  # the server has accepted them all
    return socks


def test_idle_connections_do_not_lock_out_real_requests(served, items) -> None:
    """300 sockets that send nothing, then 30 ordinary requests: all answered."""
    server = served()
    idle = _idle_sockets(server.port, 300)
    body = retrieve_body(items[0], method="vanilla")
    try:

        def one(i: int) -> int:
            with httpx.Client(base_url=server.url, timeout=30) as http:
                if i % 2:
                    return http.get("/healthz").status_code
                return http.post("/v1/retrieve", json=body).status_code

        with ThreadPoolExecutor(6) as pool:
            statuses = list(pool.map(one, range(30)))
    finally:
        for sock in idle:
            sock.close()
    assert statuses == [200] * 30


def test_at_the_connection_limit_the_longest_idle_connection_makes_room(served) -> None:
    server = served(max_connections=20)
    idle = _idle_sockets(server.port, 40)
    try:
        with httpx.Client(base_url=server.url, timeout=10) as http:
            statuses = [http.get("/healthz").status_code for _ in range(5)]
        assert statuses == [200] * 5
        closed = 0
        for sock in idle:
            sock.settimeout(0.05)
            try:
                closed += sock.recv(1) == b""
            except TimeoutError:
                pass
            except ConnectionResetError:
                closed += 1
        assert closed >= 20  # the oldest idle ones went first; at most 20 are open
    finally:
        for sock in idle:
            sock.close()


def test_a_client_that_leaves_mid_body_is_counted_499_not_500(served, caplog) -> None:
    caplog.set_level(logging.INFO)
    server = served()
    conn = Raw(server.port)
    conn.send(
        b"POST /v1/retrieve HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b'Content-Length: 5000\r\nX-Request-ID: gone-mid-body\r\n\r\n{"query": "x'
    )
    time.sleep(0.3)
    conn.close()
    deadline = time.monotonic() + 5
    labels = {"route": "/v1/retrieve", "http_method": "POST"}
    while _count(server, "lad_requests_total", status="499", **labels) < 1:
        assert time.monotonic() < deadline, "the abandoned request was never counted"
        time.sleep(0.05)
    assert _count(server, "lad_requests_total", status="500", **labels) == 0
    assert _count(server, "lad_errors_total", code="internal_error") == 0
    assert _count(server, "lad_errors_total", code="client_closed_request") == 1
    lines = [r for r in caplog.records if r.name == "lad.request" and " 499 " in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.INFO]
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not any(r.exc_info for r in caplog.records)


def _smuggling(path: str) -> bytes:
    smuggled = f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode()
    return (
        b"POST /v1/retrieve HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {5 + len(smuggled)}\r\n".encode()
        + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        + smuggled
    )


def test_content_length_with_transfer_encoding_is_refused_and_closed(served) -> None:
    server = served()
    conn = Raw(server.port)
    conn.send(_smuggling("/v1/profiles/smuggled"))
    status, headers, body = conn.response()
    assert status == 400 and headers["connection"] == "close"
    error = json.loads(body)["error"]
    assert error["code"] == "bad_request" and "Transfer-Encoding" in error["message"]
    assert error["request_id"] and headers["x-request-id"] == error["request_id"]
    assert conn.closed_within(3)
    time.sleep(0.3)
    for route in ("/v1/profiles/{name}", "/v1/retrieve", "unmatched"):
        for status in ("200", "404", "400", "422"):
            assert (
                _count(server, "lad_requests_total", route=route, http_method="GET", status=status)
                == 0
            )  # the smuggled request never ran


@pytest.mark.parametrize("pieces", [1, 8], ids=["one-write", "trickled"])
def test_a_head_over_64_kib_is_refused_431_in_the_envelope(served, pieces: int) -> None:
    server = served()
    conn = Raw(server.port)
    head = b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n"
    step = len(head) // pieces + 1
    for start in range(0, len(head), step):
        try:
            conn.send(head[start : start + step])
        except (BrokenPipeError, ConnectionResetError):
            break  # refused before the rest was sent: the answer is already in the socket
        time.sleep(0.02 if pieces > 1 else 0)
    status, headers, body = conn.response()
    assert status == 431 and headers["connection"] == "close"
    assert json.loads(body)["error"]["code"] == "headers_too_large"
    assert conn.closed_within(3)


def test_a_malformed_request_line_gets_the_envelope(served) -> None:
    server = served()
    conn = Raw(server.port)
    conn.send(b"GET /healthz HTTP/1.1 extra\r\nHost: t\r\n\r\n")
    status, headers, body = conn.response()
    assert status == 400 and headers["content-type"] == "application/json"
    assert json.loads(body)["error"]["code"] == "bad_request"
    assert conn.closed_within(3)
