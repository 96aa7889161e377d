"""The HTTP edge on a real server (uvicorn with `lad serve`'s protocol and options): bodies
counted as they arrive, chunked or not; deadlines for slow headers and slow bodies; the
keep-alive connection still usable after errors, unexpected ones included."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import pytest

from tests.api.helpers import FaultyRunner, png_bytes, retrieve_body

LIMIT = 200_000


class Raw:
    """A raw HTTP/1.1 connection: send bytes, read one response (status, headers, body)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def request(self, method: str, path: str, body: bytes = b"", **headers: str) -> None:
        lines = [f"{method} {path} HTTP/1.1", "Host: test"]
        lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
        if body or method in ("POST", "PUT"):
            lines.append(f"Content-Length: {len(body)}")
        self.send(("\r\n".join(lines) + "\r\n\r\n").encode() + body)

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buffer += chunk
        return bool(chunk)

    def response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            assert self._fill(), f"connection closed before a response: {self.buffer!r}"
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
        length = int(headers.get("content-length", 0))
        while len(self.buffer) < length:
            assert self._fill(), "connection closed inside a response body"
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(status_line.split()[1]), headers, body

    def closed_within(self, seconds: float) -> bool:
        self.sock.settimeout(seconds)
        try:
            while self._fill():
                pass
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True
        return True

    def close(self) -> None:
        self.sock.close()


def _envelope(body: bytes, code: str) -> dict[str, Any]:
    error = json.loads(body)["error"]
    assert error["code"] == code and error["message"] and error["request_id"]
    return error


@pytest.fixture
def server(live_server, runner):
    return live_server(
        runner_override=FaultyRunner(runner),
        max_body_bytes=LIMIT,
        read_timeout_s=1.5,
        header_timeout_s=1.0,
        max_image_bytes=50_000,
    )


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def test_a_chunked_body_is_refused_as_soon_as_it_passes_the_limit(server) -> None:
    conn = Raw(server.port)
    conn.send(
        b"POST /v1/retrieve HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    for _ in range(LIMIT // 10_000 + 1):  # one chunk past the limit, and no final chunk
        conn.send(_chunk(b"x" * 10_000))
    status, headers, body = conn.response()
    assert status == 413 and headers["connection"] == "close"
    assert "LAD_MAX_BODY_BYTES" in _envelope(body, "payload_too_large")["message"]
    assert conn.closed_within(5)


def test_a_declared_oversize_body_is_refused_before_it_is_sent(server) -> None:
    conn = Raw(server.port)
    conn.send(
        b"POST /v1/calibrate HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: 900000000\r\n\r\n"
    )
    status, headers, body = conn.response()
    assert status == 413 and "LAD_MAX_CALIBRATE_BODY_BYTES" in body.decode()
    assert headers["connection"] == "close"
    conn.close()


def test_routes_without_a_body_have_a_small_limit(server) -> None:
    conn = Raw(server.port)
    conn.request("POST", "/v1/profiles/default/rollback?n=3", b"x" * 70_000)
    status, _, body = conn.response()
    assert status == 413
    _envelope(body, "payload_too_large")
    conn.close()


def test_a_multipart_file_over_the_image_limit_is_refused_while_it_streams(server) -> None:
    conn = Raw(server.port)
    boundary = "b0undary"
    conn.send(
        b"POST /v1/retrieve HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n"
        + f"Content-Type: multipart/form-data; boundary={boundary}\r\n\r\n".encode()
    )
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="images"; '
        f'filename="a.png"\r\nContent-Type: image/png\r\n\r\n'
    ).encode()
    conn.send(_chunk(head))
    for _ in range(6):  # 60 kB of one file: past LAD_MAX_IMAGE_BYTES=50000, body unfinished
        conn.send(_chunk(b"\x89" * 10_000))
    status, _, body = conn.response()
    assert status == 413
    assert "LAD_MAX_IMAGE_BYTES" in _envelope(body, "image_too_large")["message"]
    conn.close()


def test_a_slow_body_gets_408_and_the_connection_is_closed(server) -> None:
    conn = Raw(server.port)
    start = time.monotonic()
    conn.send(
        b"POST /v1/retrieve HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b'Content-Length: 5000\r\n\r\n{"query": '
    )
    status, headers, body = conn.response()
    assert status == 408 and headers["connection"] == "close"
    assert "LAD_READ_TIMEOUT_S" in _envelope(body, "request_timeout")["message"]
    assert 1.0 < time.monotonic() - start < 5
    assert conn.closed_within(3)


@pytest.mark.parametrize(
    "sent",
    [b"", b"POST /v1/retrieve HTTP/1.1\r\nHost: t\r\n"],
    ids=["nothing", "half-sent-headers"],
)
def test_slow_headers_are_cut_off(server, sent: bytes) -> None:
    conn = Raw(server.port)
    conn.send(sent)
    start = time.monotonic()
    assert conn.closed_within(5)
    assert time.monotonic() - start < 4


def test_keep_alive_survives_client_errors_and_unexpected_errors(server, items) -> None:
    conn = Raw(server.port)
    good = json.dumps(retrieve_body(items[0], method="vanilla")).encode()
    boom = json.dumps({**retrieve_body(items[0], method="vanilla"), "query": "boom"}).encode()
    sequence = [
        ("POST", "/v1/retrieve", b"{not json", "application/json", 422),
        ("GET", "/v1/nothing-here", b"", None, 404),
        ("PUT", "/v1/retrieve", b"", None, 405),
        ("POST", "/v1/retrieve", boom, "application/json", 500),  # the model fails
        ("GET", "/v1/profiles/default?x=1", b"", None, 404),
        ("POST", "/v1/retrieve", good, "application/json", 200),
    ]
    for method, path, body, media, expected in sequence:
        headers = {"Content_Type": media} if media else {}
        conn.request(method, path, body, X_Request_ID=f"edge-{expected}", **headers)
        status, response_headers, payload = conn.response()
        assert status == expected, payload
        assert response_headers["x-request-id"] == f"edge-{expected}"
        assert response_headers.get("connection") != "close"
    conn.close()


def test_an_unexpected_error_answers_the_envelope_and_keeps_the_connection(
    live_server, runner, calibrate_json, caplog
) -> None:
    class Broken:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def fingerprint(self, labels: Any, n: int) -> Any:
            raise RuntimeError("secret internal detail at 0xdeadbeef")

    server = live_server(runner_override=Broken(runner))
    conn = Raw(server.port)
    conn.request(
        "POST",
        "/v1/calibrate",
        json.dumps(calibrate_json).encode(),
        Content_Type="application/json",
    )
    status, _, body = conn.response()
    assert status == 500
    error = _envelope(body, "internal_error")
    assert "secret" not in body.decode() and "0x" not in body.decode()
    lines = [r for r in caplog.records if "secret internal detail" in r.getMessage()]
    assert len(lines) == 1 and error["request_id"] in lines[0].getMessage()
    conn.request("GET", "/healthz")
    assert conn.response()[0] == 200  # same connection, still usable
    conn.close()


def test_multipart_over_a_real_connection(server, items) -> None:
    import httpx

    files = [
        ("images", (f"{i}.png", png_bytes(im), "image/png")) for i, im in enumerate(items[0].images)
    ]
    r = httpx.post(
        f"{server.url}/v1/retrieve",
        data={"query": "x", "method": "vanilla"},
        files=files,
        timeout=30,
    )
    assert r.status_code == 200, r.text
