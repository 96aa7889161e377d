"""Signals to a real `lad serve` (issue 41 item 5): SIGHUP changes nothing and drops no
request; at SIGTERM an upload that stalled is closed at once (499 at info, like a client
that left), so the drain ends with the real requests, not at LAD_DRAIN_TIMEOUT_S."""

from __future__ import annotations

import signal
import socket
import time

import pytest

from tests.e2e.test_drain import _send_in_background, _service, _wait_in_flight


@pytest.mark.slow
def test_sighup_is_ignored_and_the_requests_in_flight_are_answered(tmp_path):
    service = _service(tmp_path, drain_s=20).start()
    try:
        threads, answers = _send_in_background(service.url, 3)
        _wait_in_flight(service.url, 3)
        service.signal(signal.SIGHUP)
        for thread in threads:
            thread.join(120)
        alive = service.proc.poll() is None
    finally:
        code = service.stop()
    assert [getattr(a, "status_code", a) for a in answers] == [200, 200, 200]
    assert alive and code == 0
    assert any("received SIGHUP: ignored" in line["message"] for line in service.log_lines())


def _stalled_upload(port: int) -> socket.socket:
    """Headers declaring 100 kB, the first 1000 bytes of the body, then nothing."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(
        b"POST /v1/retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000\r\n\r\n" + b'{"query": "' + b"a" * 989
    )
    return sock


@pytest.mark.slow
def test_sigterm_closes_stalled_uploads_at_once_as_499(tmp_path):
    service = _service(tmp_path, drain_s=20).start()
    uploads: list[socket.socket] = []
    try:
        uploads = [_stalled_upload(service.port) for _ in range(4)]
        threads, answers = _send_in_background(service.url, 1)  # a real request as well
        _wait_in_flight(service.url, 5)
        time.sleep(1.2)  # the uploads have sent nothing for a second: stalled
        signalled = time.monotonic()
        service.signal()
        code = service.proc.wait(timeout=40)
        exited = time.monotonic() - signalled
        for thread in threads:
            thread.join(60)
        closed = [sock.recv(4096) for sock in uploads]  # b"": closed, no plain-text 500
    finally:
        for sock in uploads:
            sock.close()
        service.stop()
    assert [getattr(a, "status_code", a) for a in answers] == [200]
    assert code == 0 and exited < 8, (code, exited)  # not the 20 s drain
    assert closed == [b""] * 4
    lines = service.log_lines()
    refused = [line for line in lines if line.get("status") == 499]
    assert len(refused) == 4 and all(line["level"] == "info" for line in refused)
    assert all(line["error_code"] == "client_closed_request" for line in refused)
    assert not [line for line in lines if line["level"] == "error"]
    assert "Internal Server Error" not in service.log()
