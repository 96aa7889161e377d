"""A local image host for the image-URL tests: the standard library's HTTP server in a
thread on 127.0.0.1 (a free port), serving what a CDN or an attacker's host would.

Paths: ``/img/<name>`` an image added with ``add`` (Content-Length declared), and
``/pause/<name>`` the same after 0.1 s;
``/redirect?to=<url>`` a 302 to ``url``; ``/status/<code>`` that status; ``/big`` a
Content-Length of ``big_bytes`` (the body never sent); ``/flood`` ``big_bytes`` bytes
without a length (the connection closes at the end); ``/slow`` an image's first bytes,
then one byte every 0.2 s for up to 30 s. Every request is recorded (path, Host header),
so a test can show what was never asked for.
"""

from __future__ import annotations

import itertools
import ssl
import threading
import time
from collections.abc import Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out apart: no 40 ms delayed-ACK stall
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        with self.server.lock:
            self.server.requests.append((parts.path, self.headers.get("Host", "")))
        if parts.path.startswith(("/img/", "/pause/")):
            name = parts.path.split("/", 2)[2]
            with self.server.lock:
                self.server.serving += 1
                self.server.most_at_once = max(self.server.most_at_once, self.server.serving)
            if parts.path.startswith("/pause/"):
                time.sleep(0.1)
            with self.server.lock:
                self.server.serving -= 1
            body = self.server.images.get(name)
            if body is None:
                return self._status(404)
            return self._send(200, body, {"Content-Type": "image/png"})
        if parts.path == "/redirect":
            target = parse_qs(parts.query).get("to", [""])[0]
            return self._send(302, b"", {"Location": target})
        if parts.path.startswith("/status/"):
            return self._status(int(parts.path[8:]))
        if parts.path == "/big":
            self.send_response(200)
            self.send_header("Content-Length", str(self.server.big_bytes))
            self.end_headers()
            self.close_connection = True
            return None
        if parts.path == "/flood":
            left = self.server.big_bytes
            return self._stream(b"\0" * min(65536, left - i) for i in range(0, left, 65536))
        if parts.path == "/slow":
            first = [b"\x89PNG\r\n\x1a\n"]
            return self._stream(itertools.chain(first, _trickle(150, 0.2)))
        return self._status(404)

    def _stream(self, chunks: Iterable[bytes]) -> None:
        """A 200 whose body has no declared length: ``chunks``, then the connection closes
        (or the client leaves first)."""
        self.send_response(200)
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            for chunk in chunks:
                self.wfile.write(chunk)
                self.wfile.flush()
        except OSError:
            pass

    def _status(self, code: int) -> None:
        self._send(code, b"no", {"Content-Type": "text/plain"})

    def _send(self, code: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(code)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _trickle(count: int, delay: float) -> Iterator[bytes]:
    for _ in range(count):
        time.sleep(delay)
        yield b"\0"


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.images: dict[str, bytes] = {}
        self.requests: list[tuple[str, str]] = []
        self.big_bytes = 0
        self.serving = 0  # image requests being answered now
        self.most_at_once = 0


class MediaServer:
    """The server, started on enter and shut down on exit."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        """``tls``: serve https with this server context."""
        self._server = _Server()
        self.scheme = "https" if tls else "http"
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"{self.scheme}://{host}:{self.port}{path}"

    def add(self, name: str, data: bytes) -> str:
        """Serve ``data`` at ``/img/<name>``; its URL."""
        self._server.images[name] = data
        return self.url(f"/img/{name}")

    @property
    def most_at_once(self) -> int:
        """The most image requests it answered at once."""
        return self._server.most_at_once

    @property
    def requests(self) -> list[tuple[str, str]]:
        with self._server.lock:
            return list(self._server.requests)

    def set_big(self, n: int) -> None:
        self._server.big_bytes = n

    def __enter__(self) -> MediaServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
