"""``lad bench connections``: what hostile connections cost a real `lad serve`, and whether
ordinary requests still get through (issue 19, items 3, 7 and 9).

Starts `lad serve` (the demo model unless --model) on loopback and, one scenario at a time:
holds --idle sockets that send nothing, then --over-cap sockets (past LAD_MAX_CONNECTIONS),
then --idle connections trickling half a body, each time sending 30 ordinary requests
(/healthz and a small retrieve) and recording their statuses and latency; lets --disconnects
clients leave mid-body and reads how /metrics counted them; sends a request framed by both
Content-Length and Transfer-Encoding with a second request smuggled in its body; and sends
request heads of 100 KB (one write) and 200 KB (--heads at once). For each: the statuses,
the time of the slowest request of the class and the server's peak resident memory above
idle. Bounded in count and time; loopback only. Writes JSON under bench/results/.
"""

from __future__ import annotations

import base64
import contextlib
import io
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
import numpy as np
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from app.cli_help import command_parser
from lad_lab.bench.live import PeakRSS, Served
from lad_lab.bench.results import write_record

ORDINARY = 30


def _small_body() -> dict[str, Any]:
    images = []
    for colour in ("red", "green", "blue"):
        buffer = io.BytesIO()
        Image.new("RGB", (64, 64), colour).save(buffer, format="PNG")
        images.append(base64.b64encode(buffer.getvalue()).decode("ascii"))
    return {"query": "a red square", "method": "vanilla", "images": images}


def ordinary_requests(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """30 requests from 6 clients, half /healthz, half a small retrieve: statuses, latency."""

    def one(i: int) -> tuple[str, int, float]:
        kind = "healthz" if i % 2 else "retrieve"
        start = time.perf_counter()
        try:
            with httpx.Client(base_url=url, timeout=30) as http:
                if kind == "healthz":
                    status = http.get("/healthz").status_code
                else:
                    status = http.post("/v1/retrieve", json=body).status_code
        except httpx.HTTPError:
            status = 0
        return kind, status, (time.perf_counter() - start) * 1e3

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(one, range(ORDINARY)))
    record: dict[str, Any] = {"ordinary_statuses": {}}
    for _, status, _ in results:
        record["ordinary_statuses"][str(status)] = (
            record["ordinary_statuses"].get(str(status), 0) + 1
        )
    for kind in ("healthz", "retrieve"):
        latencies = np.asarray([ms for k, _, ms in results if k == kind])
        record[f"{kind}_p50_ms"] = round(float(np.percentile(latencies, 50)), 1)
        record[f"{kind}_max_ms"] = round(float(latencies.max()), 1)
    return record


@contextmanager
def held_sockets(port: int, count: int, first: bytes = b"") -> Iterator[list[socket.socket]]:
    """``count`` connections that send ``first`` and then nothing, closed on exit."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            if first:
                sock.sendall(first)
            socks.append(sock)
        time.sleep(0.5)  # accepted and read by the server
        yield socks
    finally:
        for sock in socks:
            sock.close()


def closed_count(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the server has closed (EOF or reset)."""
    closed = 0
    for sock in socks:
        sock.settimeout(0.01)
        try:
            closed += sock.recv(1) == b""
        except TimeoutError:
            pass
        except OSError:
            closed += 1
    return closed


def exchange(port: int, data: bytes, wait_s: float = 5.0) -> dict[str, Any]:
    """Send ``data`` on a fresh connection; read until the server closes (or ``wait_s``):
    the status of the first answer, how many answers came, whether it closed, the time."""
    start = time.perf_counter()
    received, closed = b"", False
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        with contextlib.suppress(OSError):  # refused before all was sent: the answer is there
            sock.sendall(data)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            except OSError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            received += chunk
    status_line = received.split(b"\r\n", 1)[0].decode("latin-1")
    return {
        "status": int(status_line.split()[1]) if status_line.startswith("HTTP/") else 0,
        "answers": received.count(b"HTTP/1.1 "),
        "closed": closed,
        "ms": round((time.perf_counter() - start) * 1e3, 1),
        "json_envelope": b'{"error":' in received,
    }


def request_counts(url: str) -> dict[tuple[str, str, str], float]:
    """lad_requests_total by (route, http_method, status), read from /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    counts: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "lad_requests_total":
                key = (
                    sample.labels["route"],
                    sample.labels["http_method"],
                    sample.labels["status"],
                )
                counts[key] = sample.value
    return counts


def scenario(served: Served, idle: float, act: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``act`` under the peak-RSS watch; its record plus the peak resident memory above
    the scenario's start and above the idle level, and what is held after it."""
    start = served.rss_mib()
    with PeakRSS(served.pid) as peak:
        record = act()
    time.sleep(1.0)
    record["peak_above_start_mib"] = round(peak.peak - start, 1)
    record["peak_above_idle_mib"] = round(peak.peak - idle, 1)
    record["held_after_mib"] = round(served.rss_mib() - idle, 1)
    return record


def run(
    model: str, idle_count: int, over_cap: int, disconnects: int, heads: int, max_connections: int
) -> dict[str, Any]:
    env = {
        "LAD_MODEL": model,
        "LAD_TORCH_THREADS": "1",
        "LAD_LOG_LEVEL": "warning",
        "LAD_MAX_CONNECTIONS": str(max_connections),
    }
    body = _small_body()
    rows: dict[str, dict[str, Any]] = {}
    with Served(env) as served:
        ordinary_requests(served.url, body)  # warm-up
        time.sleep(1.0)
        idle = served.rss_mib()
        port = served.port

        def idle_then_ordinary(count: int, first: bytes = b"") -> Callable[[], dict]:
            def act() -> dict[str, Any]:
                with held_sockets(port, count, first) as socks:
                    record = {"held": count, **ordinary_requests(served.url, body)}
                    record["held_closed_by_server"] = closed_count(socks)
                return record

            return act

        rows["idle_sockets"] = scenario(served, idle, idle_then_ordinary(idle_count))
        rows["idle_sockets_past_the_cap"] = scenario(served, idle, idle_then_ordinary(over_cap))
        slow = (
            b"POST /v1/retrieve HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\n\r\n" + b'{"query": "' + b"x" * 50_000
        )
        rows["slow_bodies"] = scenario(served, idle, idle_then_ordinary(idle_count, slow))

        def leave_mid_body() -> dict[str, Any]:
            before = request_counts(served.url)
            half = (
                b"POST /v1/retrieve HTTP/1.1\r\nHost: b\r\nContent-Type: application/json"
                b"\r\nContent-Length: 2000000\r\n\r\n" + b'{"query": "' + b"x" * 1_000_000
            )
            start = time.perf_counter()
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda _: exchange(port, half, wait_s=0.05), range(disconnects)))
            key = ("/v1/retrieve", "POST", "499")
            deadline = time.monotonic() + 30
            while True:
                after = request_counts(served.url)
                counted = after.get(key, 0) - before.get(key, 0)
                if counted >= disconnects or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            fives = sum(v - before.get(k, 0) for k, v in after.items() if k[2].startswith("5"))
            return {
                "clients": disconnects,
                "counted_499": counted,
                "counted_5xx": fives,
                "all_counted_ms": round((time.perf_counter() - start) * 1e3, 1),
            }

        rows["disconnect_mid_body"] = scenario(served, idle, leave_mid_body)

        def smuggle() -> dict[str, Any]:
            before = request_counts(served.url)
            inner = b"GET /v1/profiles/smuggled HTTP/1.1\r\nHost: b\r\n\r\n"
            data = (
                b"POST /v1/retrieve HTTP/1.1\r\nHost: b\r\nContent-Type: application/json"
                + f"\r\nContent-Length: {5 + len(inner)}\r\n".encode()
                + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
                + inner
            )
            record = exchange(port, data)
            after = request_counts(served.url)
            record["smuggled_ran"] = sum(
                v - before.get(k, 0)
                for k, v in after.items()
                if k[1] == "GET" and k[0] != "/metrics"
            )
            return record

        rows["content_length_and_transfer_encoding"] = scenario(served, idle, smuggle)
        big = b"GET /healthz HTTP/1.1\r\nHost: b\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n"
        rows["head_100kb"] = scenario(served, idle, lambda: exchange(port, big))
        bigger = b"GET /healthz HTTP/1.1\r\nHost: b\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n"

        def many_heads() -> dict[str, Any]:
            with ThreadPoolExecutor(16) as pool:
                results = list(pool.map(lambda _: exchange(port, bigger), range(heads)))
            return {
                "clients": heads,
                "statuses": sorted({r["status"] for r in results}),
                "max_ms": max(r["ms"] for r in results),
                "all_closed": all(r["closed"] for r in results),
            }

        rows["heads_200kb_concurrent"] = scenario(served, idle, many_heads)
        rows["after"] = {
            "ordinary": ordinary_requests(served.url, body),
            "held_mib": round(served.rss_mib() - idle, 1),
        }
    return {
        "model": model,
        "max_connections": max_connections,
        "idle_rss_mib": round(idle, 1),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = command_parser(prog="lad bench connections", description=__doc__, raw_description=True)
    parser.add_argument("--model", default="demo", help="model to serve")
    parser.add_argument("--idle", type=int, default=300, help="idle / slow sockets held")
    parser.add_argument(
        "--over-cap",
        type=int,
        default=1500,
        help="idle sockets held in the second scenario (past the cap)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=1024,
        help="LAD_MAX_CONNECTIONS of the server (its default: 1024)",
    )
    parser.add_argument("--disconnects", type=int, default=50, help="clients leaving mid-body")
    parser.add_argument("--heads", type=int, default=50, help="200 KB heads sent at once")
    parser.add_argument("--out", default="bench/results/connections_demo.json")
    args = parser.parse_args(argv)
    record = run(
        args.model, args.idle, args.over_cap, args.disconnects, args.heads, args.max_connections
    )
    print(f"idle RSS {record['idle_rss_mib']} MiB")
    for name, row in record["rows"].items():
        print(f"{name}: {row}")
    write_record(args.out, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
