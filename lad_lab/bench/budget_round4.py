"""Issue 41's budget and abandoned-work cases at full scale, against a `lad serve`
subprocess (demo model, default settings) served from any checkout, so that a branch and
main are measured the same way on the same machine.

    python -m lad_lab.bench.budget_round4 <checkout> five39|storm|trickle|unread

prints one JSON line: the answers and their seconds, the ``lad_inflight_bytes`` peak
(polled every 20 ms) and the server's peak RSS above idle (``VmHWM``).
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import numpy as np
from PIL import Image

MiB = 2**20


def noise(side: int, seed: int) -> str:
    """Base64 of a PNG of noise (incompressible: its size is its pixels')."""
    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def metric(name: str, text: str) -> float | None:
    found = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
    return float(found.group(1)) if found else None


def raw_post(port: int, length: int, body: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    head = (
        "POST /v1/retrieve HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


class Server:
    """`lad serve` from ``root`` on a free port, with its RSS."""

    def __init__(self, root: str) -> None:
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        path = os.pathsep.join([root, os.path.join(root, "clients", "python")])
        env = {**os.environ, "PYTHONPATH": path, "LAD_STORE_URL": "memory://"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--port", str(self.port)],
            cwd=root,
            env={**env, "LAD_LOG_LEVEL": "warning"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        for _ in range(600):
            try:
                if httpx.get(self.url + "/readyz").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("the server did not become ready")

    def rss_mib(self, field: str = "VmRSS") -> float:
        with open(f"/proc/{self.proc.pid}/status") as status:
            found = re.search(rf"{field}:\s+(\d+)", status.read())
        assert found
        return int(found.group(1)) / 1024

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def timed(server: Server, body: bytes) -> tuple[int, float]:
    """POST a JSON body to /v1/retrieve: its status and seconds."""
    start = time.monotonic()
    answer = httpx.post(
        server.url + "/v1/retrieve",
        content=body,
        headers={"content-type": "application/json"},
        timeout=120,
    )
    return answer.status_code, round(time.monotonic() - start, 2)


def five39(server: Server, small: list[str]) -> dict[str, Any]:
    """Five concurrent 39 MB retrieves (12 noise PNGs of 900² each)."""
    images = [[noise(900, 12 * k + i) for i in range(12)] for k in range(5)]
    bodies = [
        json.dumps({"query": "q", "images": each, "method": "vanilla"}).encode() for each in images
    ]
    answers: list[tuple[int, float]] = []

    threads = [
        threading.Thread(target=lambda b=b: answers.append(timed(server, b))) for b in bodies
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"body_mb": round(len(bodies[0]) / 1e6, 1), "answers": sorted(answers)}


def storm(server: Server, small: list[str]) -> dict[str, Any]:
    """Five perm_avg retrieves of 12 images (60 passes) whose clients close after 0.1 s,
    then three real retrieves."""
    perm = json.dumps(
        {"query": "q", "images": [noise(56, i) for i in range(12)], "method": "perm_avg"}
    ).encode()
    before = metric("lad_batch_size_sum", httpx.get(server.url + "/metrics").text) or 0
    socks = [raw_post(server.port, len(perm), perm) for _ in range(5)]
    time.sleep(0.1)
    for sock in socks:
        sock.close()
    answers = []
    for _ in range(3):
        start = time.monotonic()
        answer = httpx.post(
            server.url + "/v1/retrieve",
            json={"query": "q", "images": small, "method": "vanilla"},
            timeout=60,
        )
        answers.append((answer.status_code, round(time.monotonic() - start, 3)))
    time.sleep(2)
    text = httpx.get(server.url + "/metrics").text
    return {
        "real_answers": answers,
        "forwards_run": (metric("lad_batch_size_sum", text) or 0) - before - 3,
        "abandoned": re.findall(r"^lad_requests_abandoned_total\{.*", text, re.M),
    }


def trickle(server: Server, small: list[str]) -> dict[str, Any]:
    """A client declaring 64 MiB and trickling 64 KiB/s; a 32 MB retrieve 0.3 s later."""
    sock = raw_post(server.port, 64 * MiB - 1)
    stop = threading.Event()

    def feed() -> None:
        while not stop.is_set():
            try:
                sock.sendall(b" " * 6554)
            except OSError:
                return
            time.sleep(0.1)

    feeding = threading.Thread(target=feed)
    feeding.start()
    time.sleep(0.3)
    images = [noise(900, i) for i in range(10)]
    body = json.dumps({"query": "q", "images": images, "method": "vanilla"}).encode()
    out: dict[str, Any] = {
        "retrieve_body_mb": round(len(body) / 1e6, 1),
        "retrieve": timed(server, body),
    }
    sock.settimeout(40)
    try:
        out["trickler"] = sock.recv(200).split(b"\r\n")[0].decode()
    except OSError as exc:
        out["trickler"] = repr(exc)
    stop.set()
    feeding.join()
    sock.close()
    return out


def unread(server: Server, small: list[str]) -> dict[str, Any]:
    """Six clients each send a 45 MB /v1/rerank with return_documents and never read the
    answer: what the server holds 15 s later, when the gauge is back at 0, and 3 s after."""
    documents = [noise(1000, i) for i in range(12)]  # ~3.8 MB each, 45 MB of JSON
    body = json.dumps(
        {"query": "q", "documents": documents, "return_documents": True, "method": "vanilla"}
    ).encode()
    socks = []
    for _ in range(6):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", server.port))
        head = (
            "POST /v1/rerank HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        threading.Thread(target=sock.sendall, args=(head.encode() + body,), daemon=True).start()
        socks.append(sock)
    time.sleep(15)
    text = httpx.get(server.url + "/metrics").text
    out: dict[str, Any] = {
        "body_mb": round(len(body) / 1e6, 1),
        "after_15s_gauge_mib": round((metric("lad_inflight_bytes", text) or 0) / MiB, 1),
        "after_15s_rss_mib": round(server.rss_mib(), 1),
    }
    start = time.monotonic()
    while time.monotonic() - start < 90:  # every request answered or dropped: nothing held
        text = httpx.get(server.url + "/metrics").text
        if not metric("lad_inflight_bytes", text):
            break
        time.sleep(0.5)
    out["gauge_zero_after_s"] = round(15 + time.monotonic() - start, 1)
    time.sleep(3)
    out["then_rss_mib"] = round(server.rss_mib(), 1)
    for _ in range(5):  # ordinary traffic: a forward, then the worker's idle release
        httpx.post(
            server.url + "/v1/retrieve",
            json={"query": "q", "images": small, "method": "vanilla"},
            timeout=30,
        )
    time.sleep(3)
    out["after_5_small_rss_mib"] = round(server.rss_mib(), 1)
    out["abandoned"] = re.findall(r"^lad_requests_abandoned_total\{.*", text, re.M)
    for sock in socks:
        sock.close()
    time.sleep(3)
    out["clients_closed_rss_mib"] = round(server.rss_mib(), 1)
    return out


CASES = {"five39": five39, "storm": storm, "trickle": trickle, "unread": unread}


def main(argv: list[str] | None = None) -> int:
    root, case = (argv or sys.argv[1:])[:2]
    server = Server(root)
    try:
        small = [noise(64, 900 + i) for i in range(2)]
        warm = {"query": "q", "images": small, "method": "vanilla"}
        httpx.post(server.url + "/v1/retrieve", json=warm, timeout=30)
        time.sleep(1.0)
        idle = server.rss_mib()
        peak, stop = [0.0], threading.Event()

        def watch() -> None:
            with httpx.Client(base_url=server.url, timeout=10) as client:
                while not stop.is_set():
                    with_value = metric("lad_inflight_bytes", client.get("/metrics").text)
                    peak[0] = max(peak[0], with_value or 0.0)
                    time.sleep(0.02)

        watcher = threading.Thread(target=watch)
        watcher.start()
        start = time.monotonic()
        out = {"root": root, "case": case, "idle_rss_mib": round(idle, 1)}
        out.update(CASES[case](server, small))
        out["wall_s"] = round(time.monotonic() - start, 2)
        time.sleep(0.5)
        stop.set()
        watcher.join()
        out["peak_gauge_mib"] = round(peak[0] / MiB, 1)
        out["peak_rss_above_idle_mib"] = round(server.rss_mib("VmHWM") - idle, 1)
        print(json.dumps(out))
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
