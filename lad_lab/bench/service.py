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

import base64
import io
import os
from dataclasses import asdict

import httpx

from app.cli_help import command_parser
from lad_lab.bench.live import Served
from lad_lab.bench.results import conditions, write_record
from lad_lab.bench.service_details import Detail, measure_details, render_details
from lad_lab.bench.service_levels import measure_levels, render_table, run_chunk, summarize
from lad_lab.demo.world import make_items


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
        out.append(
            {
                "query": it.query,
                "images": [_jpeg_data_url(im) for im in images],
                "answer": it.target,
            }
        )
    return out


def start_server(model: str, max_batch_size: int, max_wait_ms: float, threads: int) -> Served:
    """``lad serve`` on a free loopback port with this configuration."""
    return Served(
        {
            "LAD_MODEL": model,
            "LAD_MAX_BATCH_SIZE": str(max_batch_size),
            "LAD_MAX_WAIT_MS": str(max_wait_ms),
            "LAD_MAX_QUEUE": "256",
            "LAD_TORCH_THREADS": str(threads),
        }
    ).start()


def calibrate(url: str, examples: list[dict]) -> dict:
    body = {"examples": examples, "profile": "default", "labels": "digits"}
    response = httpx.post(f"{url}/v1/calibrate", json=body, timeout=600.0)
    response.raise_for_status()
    return response.json()


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
        by_name = {
            d.name.split(",")[0] + (" large" if d.n_images == 12 else ""): d for d in details
        }
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
            **conditions(load_start),
            "rows": [asdict(r) for r in rows],
            "details": [asdict(d) for d in details],
            "summary": summary,
        },
    )
    return 0
