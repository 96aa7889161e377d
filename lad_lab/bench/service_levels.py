"""The concurrency levels of ``lad bench service``: requests/s and p50/p95 latency per
(batching configuration, concurrency), the two servers interleaved round by round, and the
HTTP + decode share of each request measured by the client and by the service itself."""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from app.service.pipeline import TIMINGS

ENGINE_STAGES = tuple(key for key in TIMINGS if key in ("forward", "score", "debias"))
"""The ``timings_ms`` keys of the model and the method (the engine's share of a request)."""


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


async def _drive(
    url: str, payloads: list[dict], concurrency: int, method: str = "agd"
) -> tuple[list, float, int]:
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
            body = {"query": payload["query"], "images": payload["images"], "method": method}
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


@dataclass
class Chunk:
    """One stretch of requests against one server: results and the server's own time."""

    results: list[tuple[float, dict]]
    elapsed_s: float
    errors: int
    server_s: float
    server_count: float


def run_chunk(url: str, payloads: list[dict], concurrency: int) -> Chunk:
    """Send ``payloads`` with ``concurrency`` in flight; scrape the server's time around it."""
    before = server_time(url)
    results, elapsed, errors = asyncio.run(_drive(url, payloads, concurrency))
    after = server_time(url)
    return Chunk(results, elapsed, errors, after[0] - before[0], after[1] - before[1])


def summarise_level(config: str, max_batch: int, concurrency: int, chunks: list[Chunk]):
    """One cell of the table from the chunks one server ran at one concurrency."""
    results = [r for c in chunks for r in c.results]
    elapsed = sum(c.elapsed_s for c in chunks)
    server_ms = 1e3 * sum(c.server_s for c in chunks) / max(sum(c.server_count for c in chunks), 1)
    latencies = np.array([r[0] for r in results])
    engine = np.array([sum(r[1].get(s, 0.0) for s in ENGINE_STAGES) for r in results])
    queue = np.array([r[1].get("queue", 0.0) for r in results])
    overhead = (latencies - queue - engine) / np.maximum(engine, 1e-9)
    return LevelResult(
        config=config,
        max_batch_size=max_batch,
        concurrency=concurrency,
        requests=len(results),
        errors=sum(c.errors for c in chunks),
        requests_per_s=len(results) / elapsed,
        p50_ms=float(np.percentile(latencies, 50)),
        p95_ms=float(np.percentile(latencies, 95)),
        engine_ms_mean=float(engine.mean()),
        queue_ms_mean=float(queue.mean()),
        overhead_ratio=float(statistics.median(overhead.tolist())),
        server_ms_mean=server_ms,
        server_overhead_ratio=float((server_ms - queue.mean() - engine.mean()) / engine.mean()),
    )


def measure_levels(
    servers: list[tuple[str, int, str]], payloads: list[dict], levels: list[int], rounds: int
) -> tuple[list[LevelResult], dict[str, float]]:
    """Every (server, concurrency) cell, the servers interleaved: the payloads go in
    ``rounds`` chunks (at concurrency 1: one request each), each chunk to every server in
    turn (order alternating), so that on a shared machine both configurations see the same
    load. Also the paired ratios of the first server over the second: the median over
    rounds of the p50 ratio (concurrency 1) and of the throughput ratio (the others)."""
    rows = []
    paired: dict[str, float] = {}
    for concurrency in levels:
        chunks: dict[str, list[Chunk]] = {name: [] for name, _, _ in servers}
        rounds_here = len(payloads) if concurrency == 1 else rounds
        for r in range(rounds_here):
            part = payloads[r::rounds_here]
            for name, _, url in servers if r % 2 == 0 else servers[::-1]:
                chunks[name].append(run_chunk(url, part, concurrency))
        for name, max_batch, _ in servers:
            row = summarise_level(name, max_batch, concurrency, chunks[name])
            rows.append(row)
            print(
                f"{name:12s} conc={concurrency:3d}  {row.requests_per_s:7.2f} req/s  "
                f"p50={row.p50_ms:8.1f} ms  p95={row.p95_ms:8.1f} ms",
                flush=True,
            )
        if len(servers) == 2:
            a, b = (chunks[name] for name, _, _ in servers)
            paired[f"c{concurrency}"] = paired_ratio(a, b, p50=concurrency == 1)
    return rows, paired


def paired_ratio(a: list[Chunk], b: list[Chunk], *, p50: bool) -> float:
    """Median over rounds of a/b: p50 latency (``p50``) or throughput, round by round."""

    def value(chunk: Chunk) -> float:
        if p50:
            return float(np.median([r[0] for r in chunk.results]))
        return len(chunk.results) / chunk.elapsed_s

    ratios = [value(x) / value(y) for x, y in zip(a, b, strict=True) if x.results and y.results]
    return float(np.median(ratios)) if ratios else float("nan")


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
    if ("batching", 1) in by and ("max batch 1", 1) in by:
        summary["batching_p50_over_max_batch_1_c1"] = (
            by[("batching", 1)].p50_ms / by[("max batch 1", 1)].p50_ms
        )
    if ("max batch 1", 1) in by:
        summary["client_http_decode_over_engine_c1"] = by[("max batch 1", 1)].overhead_ratio
        summary["server_http_decode_over_engine_c1"] = by[("max batch 1", 1)].server_overhead_ratio
    return summary
