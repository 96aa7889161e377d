"""``lad bench service``: throughput and latency of the running HTTP service over loopback.

For each batching configuration (dynamic batching on, and ``max batch = 1``) it starts
``lad serve`` as a subprocess on a free loopback port (or drives ``--url``), calibrates
one profile through ``/v1/calibrate``, then sends ``/v1/retrieve`` requests with four
224x224 JPEGs at each concurrency level and reports requests/s, p50/p95 latency and the
HTTP + decode share: (latency - queue - engine) / engine, where engine time is forward +
score + debias as the server reports them in ``timings_ms``, and latency is measured twice:
by the client (includes the client's own HTTP work) and by the service itself (the mean of
its ``lad_request_duration_seconds`` for /v1/retrieve, scraped before and after a level).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from app.bench.results import write_record
from app.demo.world import make_items

ENGINE_STAGES = ("forward", "score", "debias")


@dataclass
class LevelResult:
    """One (batching configuration, concurrency) cell of the table."""

    config: str
    max_batch_size: int
    concurrency: int
    requests: int
    errors: int
    requests_per_s: float
    p50_ms: float
    p95_ms: float
    engine_ms_mean: float
    queue_ms_mean: float
    overhead_ratio: float  # (client latency - queue - engine) / engine
    server_ms_mean: float  # the service's own request time (lad_request_duration_seconds)
    server_overhead_ratio: float  # (server time - queue - engine) / engine: HTTP + decode


def _jpeg_data_url(image, quality: int = 90) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def build_payloads(count: int, n: int, seed: str) -> list[dict]:
    """Retrieval items of the synthetic world rendered at 224 px and encoded as JPEG."""
    items = make_items(count, n_candidates=n, setting="random", seed=seed, image_size=224)
    return [
        {"query": it.query, "images": [_jpeg_data_url(im) for im in it.images], "answer": it.target}
        for it in items
    ]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(model: str, max_batch_size: int, max_wait_ms: float, threads: int) -> tuple:
    """Start ``lad serve`` on a free loopback port; returns (process, base URL)."""
    port = _free_port()
    env = dict(os.environ)
    env.update(
        LAD_MODEL=model,
        LAD_STORE_URL="memory://",
        LAD_MAX_BATCH_SIZE=str(max_batch_size),
        LAD_MAX_WAIT_MS=str(max_wait_ms),
        LAD_MAX_QUEUE="256",
        LAD_TORCH_THREADS=str(threads),
    )
    cmd = [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1.0).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise RuntimeError("server did not become ready within 180 s")


async def _drive(url: str, payloads: list[dict], concurrency: int) -> tuple[list, float, int]:
    """Send every payload once with ``concurrency`` requests in flight."""
    queue: asyncio.Queue = asyncio.Queue()
    for p in payloads:
        queue.put_nowait(p)
    results: list[tuple[float, dict]] = []
    errors = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal errors
        while not queue.empty():
            payload = queue.get_nowait()
            body = {"query": payload["query"], "images": payload["images"], "method": "agd"}
            start = time.perf_counter()
            response = await client.post(f"{url}/v1/retrieve", json=body)
            latency_ms = (time.perf_counter() - start) * 1000.0
            if response.status_code == 200:
                results.append((latency_ms, response.json()["timings_ms"]))
            else:
                errors += 1

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=120.0, limits=limits) as client:
        start = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return results, elapsed, errors


def server_time(url: str) -> tuple[float, float]:
    """(sum of seconds, count) of the service's own POST /v1/retrieve request durations."""
    text = httpx.get(f"{url}/metrics", timeout=10.0).text
    total = count = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != "lad_request_duration_seconds":
            continue
        for sample in family.samples:
            if sample.labels.get("route") != "/v1/retrieve":
                continue
            if sample.name.endswith("_sum"):
                total += sample.value
            elif sample.name.endswith("_count"):
                count += sample.value
    return total, count


def measure_level(url: str, config: str, max_batch: int, payloads: list[dict], concurrency: int):
    """Run one cell and summarise it."""
    before = server_time(url)
    results, elapsed, errors = asyncio.run(_drive(url, payloads, concurrency))
    after = server_time(url)
    server_ms = 1e3 * (after[0] - before[0]) / max(after[1] - before[1], 1.0)
    latencies = np.array([r[0] for r in results])
    engine = np.array([sum(r[1].get(s, 0.0) for s in ENGINE_STAGES) for r in results])
    queue = np.array([r[1].get("queue", 0.0) for r in results])
    overhead = (latencies - queue - engine) / np.maximum(engine, 1e-9)
    return LevelResult(
        config=config,
        max_batch_size=max_batch,
        concurrency=concurrency,
        requests=len(results),
        errors=errors,
        requests_per_s=len(results) / elapsed,
        p50_ms=float(np.percentile(latencies, 50)),
        p95_ms=float(np.percentile(latencies, 95)),
        engine_ms_mean=float(engine.mean()),
        queue_ms_mean=float(queue.mean()),
        overhead_ratio=float(statistics.median(overhead.tolist())),
        server_ms_mean=server_ms,
        server_overhead_ratio=float((server_ms - queue.mean() - engine.mean()) / engine.mean()),
    )


def calibrate(url: str, examples: list[dict]) -> dict:
    body = {"examples": examples, "profile": "default", "labels": "digits"}
    response = httpx.post(f"{url}/v1/calibrate", json=body, timeout=600.0)
    response.raise_for_status()
    return response.json()


def render_table(rows: list[LevelResult]) -> str:
    head = (
        "| config | max batch | conc. | req/s | p50 ms | p95 ms | engine ms | queue ms "
        "| client (HTTP+decode)/engine | server ms | server (HTTP+decode)/engine |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        lines.append(
            f"| {r.config} | {r.max_batch_size} | {r.concurrency} | {r.requests_per_s:.2f} | "
            f"{r.p50_ms:.1f} | {r.p95_ms:.1f} | {r.engine_ms_mean:.1f} | {r.queue_ms_mean:.1f} | "
            f"{r.overhead_ratio:.3f} | {r.server_ms_mean:.1f} | {r.server_overhead_ratio:.3f} |"
        )
    return "\n".join(lines)


def summarize(rows: list[LevelResult], levels: list[int]) -> dict[str, float]:
    """The headline ratios: batching speed-up at the top concurrency, overheads at 1."""
    summary: dict[str, float] = {}
    by = {(r.config, r.concurrency): r for r in rows}
    top = max(levels)
    if ("batching", top) in by and ("max batch 1", top) in by:
        summary["batching_speedup_at_max_concurrency"] = (
            by[("batching", top)].requests_per_s / by[("max batch 1", top)].requests_per_s
        )
    if ("max batch 1", 1) in by:
        summary["client_http_decode_over_engine_c1"] = by[("max batch 1", 1)].overhead_ratio
        summary["server_http_decode_over_engine_c1"] = by[("max batch 1", 1)].server_overhead_ratio
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lad bench service", description=__doc__)
    parser.add_argument("--url", help="drive an already running service (one configuration)")
    parser.add_argument("--model", default="demo")
    parser.add_argument("--n", type=int, default=4, help="images per request")
    parser.add_argument("--requests", type=int, default=64, help="requests per concurrency level")
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--max-wait-ms", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the server")
    parser.add_argument("--out", default="bench/results/service.json")
    args = parser.parse_args(argv)

    levels = [int(c) for c in args.concurrency.split(",")]
    payloads = build_payloads(args.requests, args.n, seed="test")
    calibration = build_payloads(5, args.n, seed="calibration")
    configs = [("batching", args.max_batch_size), ("max batch 1", 1)]
    if args.url:
        configs = [("external", -1)]

    rows: list[LevelResult] = []
    for name, max_batch in configs:
        proc = None
        url = args.url
        if url is None:
            proc, url = start_server(args.model, max_batch, args.max_wait_ms, args.threads)
        try:
            calibrate(url, calibration)
            measure_level(url, name, max_batch, payloads[:4], 1)  # warm-up
            for concurrency in levels:
                row = measure_level(url, name, max_batch, payloads, concurrency)
                rows.append(row)
                print(
                    f"{name:12s} conc={concurrency:3d}  {row.requests_per_s:7.2f} req/s  "
                    f"p50={row.p50_ms:8.1f} ms  p95={row.p95_ms:8.1f} ms",
                    flush=True,
                )
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)

    table = render_table(rows)
    print(table)
    summary = summarize(rows, levels)
    for key, value in summary.items():
        print(f"{key}: {value:.3f}")
    write_record(args.out, {
        "command": "lad bench service " + " ".join(argv or []),
        "model": args.model,
        "n_images": args.n,
        "image": "224x224 JPEG",
        "server_torch_threads": args.threads,
        "cpu_count": os.cpu_count(),
        "rows": [asdict(r) for r in rows],
        "summary": summary,
    })
    return 0
