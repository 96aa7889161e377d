"""``lad bench memory``: what a request of big images costs the service in resident memory.

Starts `lad serve` (the demo model unless --model) on loopback and sends one request of
twelve 4096x4096 images (PNG, then JPEG), then four such requests at once, measuring the
process's peak resident memory above its idle level (after a warm-up request) and what is
still held a few seconds after the answers. Targets (issue 10): one request < 300 MiB
above idle, four concurrent < 1 GiB, nothing held afterwards. Prints a table and writes
JSON under bench/results/.

``--rerank C [C ...]`` measures /v1/rerank instead: one request of C distinct documents
(``--side`` PNGs) for each C, ranked in full (top_n = C) and with top_n unset, the peak
above idle beside the body's size and the forward passes spent (a rerank decodes a batch of
windows at a time, so its memory should follow its bytes, not C).
"""

from __future__ import annotations

import base64
import io
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from PIL import Image, ImageDraw

from app.cli_help import command_parser
from lad_lab.bench.live import PeakRSS, Served
from lad_lab.bench.results import write_record

SIDE = 4096


def big_image(fmt: str, side: int = SIDE) -> str:
    """A side x side picture (gradients and shapes, compressible like a screenshot), base64."""
    gradient = Image.linear_gradient("L").resize((side, side))
    image = Image.merge("RGB", (gradient, gradient.rotate(90), gradient.rotate(180)))
    draw = ImageDraw.Draw(image)
    for k in range(12):
        x0, y0 = (k * 331) % (side - 600), (k * 577) % (side - 600)
        draw.ellipse((x0, y0, x0 + 500, y0 + 400), fill=(40 * k % 255, 200, 90))
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **({"quality": 85} if fmt == "JPEG" else {}))
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def document(index: int, side: int) -> str:
    """A distinct side x side PNG per index (a gradient and a disc where the index says)."""
    gradient = Image.linear_gradient("L").resize((side, side)).rotate(index % 360)
    image = Image.merge("RGB", (gradient, gradient.rotate(90), gradient.rotate(180)))
    x, y = (index * 37) % side, (index * 91) % side
    ImageDraw.Draw(image).ellipse((x - side // 6, y - side // 6, x + side // 6, y + side // 6))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _post(url: str, body: dict[str, Any]) -> tuple[int, float]:
    start = time.perf_counter()
    response = httpx.post(f"{url}/v1/retrieve", json=body, timeout=300.0)
    return response.status_code, time.perf_counter() - start


def _rerank(url: str, body: dict[str, Any]) -> tuple[int, float, int | None]:
    """(status, seconds, forward passes spent)."""
    start = time.perf_counter()
    response = httpx.post(f"{url}/v1/rerank", json=body, timeout=600.0)
    seconds = time.perf_counter() - start
    ok = response.status_code == 200
    return response.status_code, seconds, response.json()["usage"]["forward_passes"] if ok else None


def measure(
    served: Served, body: dict[str, Any], concurrent: int, settle_s: float, idle: float
) -> dict[str, Any]:
    """Peak RSS above idle while `concurrent` copies of `body` are answered, and what is held
    `settle_s` after the last answer."""
    with PeakRSS(served.pid) as peak, ThreadPoolExecutor(concurrent) as pool:
        results = list(pool.map(lambda _: _post(served.url, body), range(concurrent)))
    time.sleep(settle_s)
    return {
        "concurrent": concurrent,
        "statuses": [s for s, _ in results],
        "latency_s_max": round(max(t for _, t in results), 3),
        "peak_above_idle_mib": round(peak.peak - idle, 1),
        "held_after_mib": round(served.rss_mib() - idle, 1),
    }


def run(model: str, threads: int, settle_s: float, side: int = SIDE) -> dict[str, Any]:
    images = {fmt: big_image(fmt, side) for fmt in ("PNG", "JPEG")}
    env = {"LAD_MODEL": model, "LAD_TORCH_THREADS": str(threads)}
    rows: list[dict[str, Any]] = []
    with Served(env) as served:
        small = {
            "query": "a red circle",
            "method": "vanilla",
            "images": [big_image("JPEG", 224)] * 4,
        }
        for _ in range(3):  # warm-up: first-request allocations are not the decode's cost
            _post(served.url, small)
        time.sleep(settle_s)
        idle = served.rss_mib()
        for fmt, encoded in images.items():
            body = {"query": "a red circle", "method": "vanilla", "images": [encoded] * 12}
            for concurrent in (1, 4):
                row = measure(served, body, concurrent, settle_s, idle)
                row.update(format=fmt, request_mib=round(len(encoded) * 12 / 2**20, 2))
                rows.append(row)
        final_held = round(served.rss_mib() - idle, 1)
    return {
        "model": model,
        "threads": threads,
        "side": side,
        "images_per_request": 12,
        "idle_rss_mib": round(idle, 1),
        "final_held_mib": final_held,
        "rows": rows,
    }


def run_rerank(
    model: str, threads: int, settle_s: float, counts: list[int], side: int
) -> dict[str, Any]:
    env = {
        "LAD_MODEL": model,
        "LAD_TORCH_THREADS": str(threads),
        "LAD_MAX_RERANK_CANDIDATES": str(max(counts)),
        "LAD_MAX_BODY_BYTES": str(1 << 30),
    }
    docs = [document(i, side) for i in range(max(counts))]
    rows: list[dict[str, Any]] = []
    with Served(env) as served:
        warm = {"query": "a red circle", "method": "vanilla", "documents": docs[:4], "top_n": 2}
        for _ in range(3):
            _rerank(served.url, warm)
        time.sleep(settle_s)
        idle = served.rss_mib()
        for c in counts:
            for top_n in (None, c):
                body: dict[str, Any] = {"query": "a red circle", "method": "vanilla", "seed": 1}
                body.update(documents=docs[:c], **({} if top_n is None else {"top_n": top_n}))
                with PeakRSS(served.pid) as peak:
                    status, latency, forwards = _rerank(served.url, body)
                time.sleep(settle_s)
                rows.append(
                    {
                        "documents": c,
                        "top_n": top_n,
                        "status": status,
                        "body_mib": round(sum(map(len, docs[:c])) / 2**20, 1),
                        "forward_passes": forwards,
                        "latency_s": round(latency, 2),
                        "peak_above_idle_mib": round(peak.peak - idle, 1),
                        "held_after_mib": round(served.rss_mib() - idle, 1),
                    }
                )
    return {"model": model, "threads": threads, "side": side, "idle_rss_mib": round(idle, 1),
            "rows": rows}  # fmt: skip


def _print_rerank(record: dict[str, Any]) -> None:
    print(f"idle RSS {record['idle_rss_mib']} MiB; /v1/rerank of {record['side']}² PNGs")
    print("| documents | top_n | status | body MiB | forwards | latency s | peak above idle MiB |")
    print("|--:|--:|:--|--:|--:|--:|--:|")
    for r in record["rows"]:
        print(
            f"| {r['documents']} | {r['top_n'] or 'unset'} | {r['status']} | {r['body_mib']} | "
            f"{r['forward_passes']} | {r['latency_s']} | {r['peak_above_idle_mib']} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = command_parser(prog="lad bench memory", description=__doc__, raw_description=True)
    parser.add_argument("--model", default="demo", help="model to serve (default: demo)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the server")
    parser.add_argument(
        "--settle-s",
        type=float,
        default=3.0,
        help="seconds to wait before reading what is held (default 3)",
    )
    parser.add_argument(
        "--side", type=int, default=SIDE, help=f"image side in pixels (default {SIDE})"
    )
    parser.add_argument(
        "--rerank",
        type=int,
        nargs="*",
        default=[],
        help="measure one /v1/rerank of each of these document counts instead (--side: 512 "
        "if unset)",
    )
    parser.add_argument("--out", default=None, help="record (default: bench/results/...)")
    args = parser.parse_args(argv)
    if args.rerank:
        side = args.side if args.side != SIDE else 512
        record = run_rerank(args.model, args.threads, args.settle_s, args.rerank, side)
        _print_rerank(record)
        write_record(args.out or "bench/results/memory_rerank_demo.json", record)
        return 0
    record = run(args.model, args.threads, args.settle_s, args.side)
    print(f"idle RSS {record['idle_rss_mib']} MiB; requests of 12 x {args.side}x{args.side} images")
    print(
        "| format | request MiB | concurrent | statuses | max latency s | peak above idle "
        "MiB | held after MiB |"
    )
    print("|:--|--:|--:|:--|--:|--:|--:|")
    for r in record["rows"]:
        print(
            f"| {r['format']} | {r['request_mib']} | {r['concurrent']} | "
            f"{','.join(map(str, sorted(set(r['statuses']))))} | {r['latency_s_max']} | "
            f"{r['peak_above_idle_mib']} | {r['held_after_mib']} |"
        )
    print(f"held at the end: {record['final_held_mib']} MiB above idle")
    write_record(args.out or "bench/results/memory_demo.json", record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
