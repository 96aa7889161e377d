"""``lad bench service``: throughput and latency of the running HTTP service over loopback.

For each batching configuration (adaptive batching on, and ``max batch = 1``) it starts
``lad serve`` as a subprocess on a free loopback port (or drives ``--url``); both run at
once and every level is sent in rounds that alternate between them, so on a shared machine
both see the same load and the ratios between them hold. It calibrates
one profile through ``/v1/calibrate``, then sends ``/v1/retrieve`` requests with four
224x224 JPEGs at each concurrency level and reports requests/s, p50/p95 latency and the
HTTP + decode share: (latency - queue - engine) / engine, where engine time is forward +
score + debias as the server reports them in ``timings_ms``, and latency is measured twice:
by the client (includes the client's own HTTP work) and by the service itself (the mean of
its ``lad_request_duration_seconds`` for /v1/retrieve, scraped before and after a level).

Then, on the batching server at concurrency 1, the per-stage breakdown of a request
(medians of the response's ``timings_ms``; "HTTP+JSON" is the service's own time, its
``Server-Timing: app;dur=`` header, minus every stage it timed; "client" is the client's
latency minus the service's time: the client's HTTP work and the loopback) and its fixed
path (the service's own time but queue, forward, score and debias) for four 224x224 JPEGs
and for twelve 4096x4096 JPEGs, and the wall-clock
of perm_avg (N rotations, one batch) against vanilla. The headline ratios: batching over
max-batch-1 p50 at concurrency 1 (target <= 1.15) and throughput at the top concurrency
(target >= 2).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from app.bench.live import Served
from app.bench.results import write_record
from app.cli_help import command_parser
from app.demo.world import make_items

ENGINE_STAGES = ("forward", "score", "debias")
SERVER_STAGES = ("base64", "image_decode", "queue", "process", "forward", "score", "debias",
                 "encode")  # fmt: skip
"""What the server times, disjoint: image_decode = decode - base64 (decode includes it)."""
FIXED_STAGES = ("http_json", "base64", "image_decode", "process", "encode")
"""The fixed path of a request: what it costs around the model, however fast the model."""


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


def build_payloads(count: int, n: int, seed: str, side: int = 224) -> list[dict]:
    """Retrieval items of the synthetic world rendered at 224 px and encoded as JPEG (at
    ``side`` px: rendered at 224 and enlarged, so the JPEGs stay photo-sized in bytes)."""
    items = make_items(count, n_candidates=n, setting="random", seed=seed, image_size=224)
    out = []
    for it in items:
        images = it.images if side == 224 else [im.resize((side, side)) for im in it.images]
        out.append({"query": it.query, "images": [_jpeg_data_url(im) for im in images],
                    "answer": it.target})  # fmt: skip
    return out


def start_server(model: str, max_batch_size: int, max_wait_ms: float, threads: int) -> Served:
    """``lad serve`` on a free loopback port with this configuration."""
    return Served({
        "LAD_MODEL": model, "LAD_MAX_BATCH_SIZE": str(max_batch_size),
        "LAD_MAX_WAIT_MS": str(max_wait_ms), "LAD_MAX_QUEUE": "256",
        "LAD_TORCH_THREADS": str(threads),
    }).start()  # fmt: skip


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


def measure_levels(servers: list[tuple[str, int, str]], payloads: list[dict], levels: list[int],
                   rounds: int) -> tuple[list[LevelResult], dict[str, float]]:  # fmt: skip
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
            print(f"{name:12s} conc={concurrency:3d}  {row.requests_per_s:7.2f} req/s  "
                  f"p50={row.p50_ms:8.1f} ms  p95={row.p95_ms:8.1f} ms", flush=True)  # fmt: skip
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


Sample = tuple[float, float | None, dict]
"""One request: (client latency ms, the service's own ms from Server-Timing, timings_ms)."""


def server_timing_ms(header: str | None) -> float | None:
    """The ``app`` duration of a ``Server-Timing`` header (None if absent: an older server)."""
    for metric in (header or "").split(","):
        name, *params = (part.strip() for part in metric.split(";"))
        if name == "app":
            for param in params:
                if param.startswith("dur="):
                    return float(param[4:])
    return None


def stage_breakdown(results: list[Sample]) -> dict[str, float]:
    """Median milliseconds per stage over requests.

    ``http_json`` is what the service spent on the request but did not time by stage:
    HTTP parsing, JSON parsing and validation, response serialisation, the thread
    hand-offs (the service's own time minus its stages; the client's latency stands in
    for it where the server sends no Server-Timing). ``client`` is the client's latency
    minus the service's time: the client's own HTTP work and the loopback. ``fixed`` is
    the request's fixed path, the service's time but queue, forward, score and debias."""
    rows = []
    for latency, server, t in results:
        own = latency if server is None else server
        row = {s: float(t.get(s, 0.0)) for s in SERVER_STAGES if s != "image_decode"}
        row["image_decode"] = max(0.0, t.get("decode", 0.0) - t.get("base64", 0.0))
        row["http_json"] = own - sum(row[s] for s in SERVER_STAGES)
        row["fixed"] = sum(row[s] for s in FIXED_STAGES)
        row["client"] = latency - own
        row["latency"] = latency
        rows.append(row)
    return {k: float(np.median([r[k] for r in rows])) for k in rows[0]}


@dataclass
class Detail:
    """One request shape measured alone (concurrency 1) on the batching server."""

    name: str
    method: str
    n_images: int
    image: str
    requests: int
    p50_ms: float
    stages_ms: dict[str, float]


SMALL_METHODS = ("agd", "vanilla", "perm_avg")


async def _one_by_one(url: str, jobs: list[tuple[dict, str]]) -> list[Sample]:
    """A ``Sample`` of each (payload, method), sent one after the other over one
    kept-alive connection (a new client per request would bill its connect to HTTP), each
    body encoded before its clock starts (the client's JSON encoding is not the server's)."""
    out = []
    headers = {"content-type": "application/json"}
    async with httpx.AsyncClient(timeout=120.0) as client:
        for payload, method in jobs:
            body = {"query": payload["query"], "images": payload["images"], "method": method}
            content = json.dumps(body).encode()
            start = time.perf_counter()
            response = await client.post(f"{url}/v1/retrieve", content=content, headers=headers)
            latency_ms = (time.perf_counter() - start) * 1e3
            if response.status_code != 200:
                raise RuntimeError(f"a {method} request failed: {response.status_code}")
            server_ms = server_timing_ms(response.headers.get("server-timing"))
            out.append((latency_ms, server_ms, response.json()["timings_ms"]))
    return out


def measure_details(
    url: str, payloads: list[dict], large: list[dict]
) -> tuple[list[Detail], float]:
    """The per-stage rows: agd, vanilla and perm_avg on four 224² JPEGs, sent request by
    request in turn (so the three see the same load), then vanilla on twelve 4096² JPEGs
    (the fixed path does not depend on the method). Also perm_avg over vanilla, paired:
    the median over payloads of the two requests' latency ratio."""
    jobs = [(p, m) for p in payloads[:1] for m in SMALL_METHODS]  # warm-up of each shape
    for k, payload in enumerate(payloads):
        jobs += [(payload, m) for m in SMALL_METHODS[k % 3 :] + SMALL_METHODS[: k % 3]]
    done = asyncio.run(_one_by_one(url, jobs))[len(SMALL_METHODS) :]
    results: dict[str, list[Sample]] = {m: [] for m in SMALL_METHODS}
    for (_, method), result in zip(jobs[len(SMALL_METHODS) :], done, strict=True):
        results[method].append(result)
    small = "224x224 JPEG"
    n = len(payloads[0]["images"])
    details = [
        Detail(name=f"{m}, {n} x 224²", method=m, n_images=n, image=small,
               requests=len(results[m]), p50_ms=stage_breakdown(results[m])["latency"],
               stages_ms=stage_breakdown(results[m]))
        for m in SMALL_METHODS
    ]  # fmt: skip
    ratios = [p[0] / v[0] for p, v in zip(results["perm_avg"], results["vanilla"], strict=True)]
    if large:
        got = asyncio.run(_one_by_one(url, [(p, "vanilla") for p in large[:1] + large]))[1:]
        stages = stage_breakdown(got)
        details.append(Detail(name="vanilla, 12 x 4096²", method="vanilla", n_images=12,
                              image="4096x4096 JPEG", requests=len(got),
                              p50_ms=stages["latency"], stages_ms=stages))  # fmt: skip
    return details, float(np.median(ratios))


def render_details(details: list[Detail]) -> str:
    cols = ("latency", "client", "http_json", "base64", "image_decode", "process", "queue",
            "forward", "score", "debias", "encode", "fixed")  # fmt: skip
    head = ("| request (concurrency 1, median ms) | latency | client | HTTP+JSON | base64 "
            "| image decode | processor | queue | forward | score | debias | encode "
            "| fixed path |")  # fmt: skip
    lines = [head, "|:--|" + "--:|" * len(cols)]
    for d in details:
        cells = (f"{d.stages_ms[c]:.2f}" if c in d.stages_ms else "–" for c in cols)
        lines.append(f"| {d.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


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
    if ("batching", 1) in by and ("max batch 1", 1) in by:
        summary["batching_p50_over_max_batch_1_c1"] = (
            by[("batching", 1)].p50_ms / by[("max batch 1", 1)].p50_ms
        )
    if ("max batch 1", 1) in by:
        summary["client_http_decode_over_engine_c1"] = by[("max batch 1", 1)].overhead_ratio
        summary["server_http_decode_over_engine_c1"] = by[("max batch 1", 1)].server_overhead_ratio
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = command_parser(prog="lad bench service", description=__doc__)
    parser.add_argument("--url", help="drive an already running service (one configuration)")
    parser.add_argument("--model", default="demo")
    parser.add_argument("--n", type=int, default=4, help="images per request")
    parser.add_argument(
        "--requests", type=int, default=96, help="requests per concurrency level and server"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="chunks per level, alternating between servers"
    )
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--max-wait-ms", type=float, default=0.0)
    parser.add_argument(
        "--detail-requests",
        type=int,
        default=32,
        help="requests per per-stage row (0: no per-stage rows)",
    )
    parser.add_argument(
        "--large-requests", type=int, default=8, help="requests of twelve 4096x4096 JPEGs (0: none)"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the server")
    parser.add_argument("--out", default="bench/results/service.json")
    args = parser.parse_args(argv)

    load_start = os.getloadavg()[0]  # this machine may be shared: note the load
    levels = [int(c) for c in args.concurrency.split(",")]
    payloads = build_payloads(args.requests, args.n, seed="test")
    calibration = build_payloads(5, args.n, seed="calibration")
    configs = [("batching", args.max_batch_size), ("max batch 1", 1)]
    if args.url:
        configs = [("external", -1)]
    detail_payloads = build_payloads(args.detail_requests, args.n, seed="eval")
    large = build_payloads(args.large_requests, 12, seed="eval", side=4096)

    details: list[Detail] = []
    perm_ratio = float("nan")
    procs = []
    try:
        servers = []
        for name, max_batch in configs:
            url = args.url
            if url is None:
                server = start_server(args.model, max_batch, args.max_wait_ms, args.threads)
                procs.append(server)
                url = server.url
            calibrate(url, calibration)
            run_chunk(url, payloads[:4], 1)  # warm-up
            servers.append((name, max_batch, url))
        rows, paired = measure_levels(servers, payloads, levels, args.rounds)
        if args.detail_requests:
            details, perm_ratio = measure_details(servers[0][2], detail_payloads, large)
    finally:
        for server in procs:
            server.stop()

    table = render_table(rows)
    print(table)
    summary = summarize(rows, levels)
    if "c1" in paired:
        summary["batching_p50_over_max_batch_1_c1_paired"] = paired["c1"]
    if f"c{max(levels)}" in paired and max(levels) > 1:
        summary["batching_speedup_at_max_concurrency_paired"] = paired[f"c{max(levels)}"]
    if details:
        print(render_details(details))
        by_name = {d.name.split(",")[0] + (" large" if d.n_images == 12 else ""): d
                   for d in details}  # fmt: skip
        summary["perm_avg_over_vanilla_c1"] = by_name["perm_avg"].p50_ms / by_name["vanilla"].p50_ms
        summary["perm_avg_over_vanilla_c1_paired"] = perm_ratio
        summary["fixed_path_ms_4x224"] = by_name["agd"].stages_ms["fixed"]
        if "vanilla large" in by_name:
            summary["fixed_path_ms_12x4096"] = by_name["vanilla large"].stages_ms["fixed"]
    for key, value in summary.items():
        print(f"{key}: {value:.3f}")
    write_record(
        args.out,
        {
            "command": "lad bench service " + " ".join(argv or []),
            "model": args.model,
            "n_images": args.n,
            "image": "224x224 JPEG",
            "server_torch_threads": args.threads,
            "cpu_count": os.cpu_count(),
            "device": os.environ.get("LAD_DEVICE", "auto"),
            "load_avg_1min": {"start": load_start, "end": os.getloadavg()[0]},
            "rows": [asdict(r) for r in rows],
            "details": [asdict(d) for d in details],
            "summary": summary,
        },
    )
    return 0
