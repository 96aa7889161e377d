"""``lad bench peer``: our service side by side with vLLM serving the same checkpoint.

One run starts ``lad serve`` (one per ``--threads`` setting) and, with ``--peer-python``,
vLLM's OpenAI server on the same checkpoint (or drives ``--peer-url``), then sends the same
workload to every side: query + N images with the same prompt text, as a stream of distinct
images (fresh ones at every level: a prompt seen before is a prefix-cache hit) and as a
repeated-image stream (a few requests' images again and again, rotated: what the encoder
caches see in practice), at each concurrency. Rounds are interleaved, the
order of the sides rotating, so that on a shared machine all see the same load; the
requests/s ratio to the reference side (the peer, else ``--threads 1``) is reported per
round as its median and min-max. Also p50/p95, start-up time to ready, the peak resident
memory across each side's process tree, and the agreement of answers: our vanilla index
(argmax of ``raw_probabilities``) against vLLM's argmax over the label tokens.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from app.cli_help import command_parser
from lad_lab.bench.live import Served, free_port
from lad_lab.bench.peer_server import (
    PeerServer,
    TreePeak,
    chat_body,
    label_token_ids,
    peer_answer,
    prepare_checkpoint,
)
from lad_lab.bench.results import conditions, write_record
from lad_lab.bench.service import build_payloads, calibrate

PEER = "vllm"
STREAMS = ("distinct", "repeated")
REPEATED_POOL = 6
"""Requests whose images the repeated stream cycles through (24 images at N = 4)."""


@dataclass
class Side:
    """One server under test: ours at one thread setting, or the peer."""

    name: str
    kind: str  # "lad" or "vllm"
    url: str
    pid: int | None
    startup_s: float
    threads: str | None = None
    peak_rss_mib: float = 0.0
    engine: dict[str, Any] = field(default_factory=dict)  # ours: /readyz's model (dtype...)


@dataclass
class Chunk:
    """One round of one (stream, concurrency) on one side."""

    elapsed_s: float
    latencies_ms: list[float]
    answers: dict[int, int | None]  # payload index -> the answer's 0-based index
    errors: int


@dataclass
class Cell:
    """One (stream, concurrency, side) row of the table."""

    stream: str
    concurrency: int
    side: str
    requests: int
    errors: int
    requests_per_s: float
    p50_ms: float
    p95_ms: float
    ratio: dict[str, float] = field(default_factory=dict)  # to the reference: median/min/max


def repeated_stream(pool: list[dict], count: int) -> list[dict]:
    """``count`` requests over the images of ``pool``: request i is pool[i % len] with its
    images rotated by i // len (the same images again, in another order: the answer moves)."""
    out = []
    for i in range(count):
        base = pool[i % len(pool)]
        shift = (i // len(pool)) % len(base["images"])
        images = base["images"][shift:] + base["images"][:shift]
        answer = (base["answer"] - shift) % len(images)
        out.append({"query": base["query"], "images": images, "answer": answer})
    return out


def ratio_spread(ours: list[float], theirs: list[float]) -> dict[str, float]:
    """Per-round ratios ours/theirs (requests/s): their median, min and max."""
    ratios = [a / b for a, b in zip(ours, theirs, strict=True) if a > 0 and b > 0]
    if not ratios:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan")}
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


def agreement(ours: dict[int, int | None], theirs: dict[int, int | None]) -> dict[str, int]:
    """How many requests both sides answered, and on how many their index is the same."""
    both = [k for k in ours if k in theirs and ours[k] is not None and theirs[k] is not None]
    return {"requests": len(both), "agree": sum(ours[k] == theirs[k] for k in both)}


def summarise(stream: str, concurrency: int, side: str, chunks: list[Chunk]) -> Cell:
    latencies = [x for c in chunks for x in c.latencies_ms]
    elapsed = sum(c.elapsed_s for c in chunks)
    return Cell(
        stream=stream,
        concurrency=concurrency,
        side=side,
        requests=len(latencies),
        errors=sum(c.errors for c in chunks),
        requests_per_s=len(latencies) / elapsed if elapsed > 0 else 0.0,
        p50_ms=float(np.percentile(latencies, 50)) if latencies else float("nan"),
        p95_ms=float(np.percentile(latencies, 95)) if latencies else float("nan"),
    )


def render(record: dict[str, Any]) -> str:
    """The record's table: one row per (stream, concurrency, side), ratios to the reference,
    then each side's start-up and peak memory, and the answers' agreement."""
    ref = record["reference"]
    lines = [
        f"| stream | conc. | side | req/s | p50 ms | p95 ms | req/s ÷ {ref} (median, min-max) |",
        "|:--|--:|:--|--:|--:|--:|:--|",
    ]
    for c in record["cells"]:
        r = c["ratio"]
        ratio = f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})" if r else "–"
        lines.append(
            f"| {c['stream']} | {c['concurrency']} | {c['side']} | {c['requests_per_s']:.2f} | "
            f"{c['p50_ms']:.0f} | {c['p95_ms']:.0f} | {ratio} |"
        )
    lines += ["", "| side | start-up to ready s | peak RSS (process tree) MiB |", "|:--|--:|--:|"]
    for s in record["sides"]:
        lines.append(f"| {s['name']} | {s['startup_s']:.1f} | {s['peak_rss_mib']:.0f} |")
    if record.get("agreement"):
        a = record["agreement"]
        lines += [
            "",
            f"Answers: our vanilla index equals {PEER}'s argmax over the label tokens on "
            f"{a['agree']} of {a['requests']} requests.",
        ]
    return "\n".join(lines)


async def _drive(sides_send, payloads: list[dict], concurrency: int) -> Chunk:
    """Send ``payloads`` (index, body) with ``concurrency`` in flight through ``sides_send``."""
    queue: asyncio.Queue = asyncio.Queue()
    for item in payloads:
        queue.put_nowait(item)
    latencies: list[float] = []
    answers: dict[int, int | None] = {}
    errors = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal errors
        while not queue.empty():
            index, payload = queue.get_nowait()
            start = time.perf_counter()
            try:
                answer = await sides_send(client, payload)
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                errors += 1
                print(f"request failed: {exc!r}"[:300], flush=True)
                continue
            latencies.append((time.perf_counter() - start) * 1e3)
            answers[index] = answer

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=600.0, limits=limits) as client:
        start = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return Chunk(elapsed, latencies, answers, errors)


def sender(side: Side, method: str, labels: list[str], token_ids: list[int], served: str):
    """The coroutine that sends one payload to ``side`` and returns the answer's index
    (ours: the vanilla index, argmax of raw_probabilities, whatever the method)."""

    async def lad(client: httpx.AsyncClient, payload: dict) -> int | None:
        body = {"query": payload["query"], "images": payload["images"], "method": method}
        response = await client.post(f"{side.url}/v1/retrieve", json=body)
        response.raise_for_status()
        return int(np.argmax(response.json()["raw_probabilities"]))

    async def peer(client: httpx.AsyncClient, payload: dict) -> int | None:
        body = chat_body(payload, served, labels, token_ids)
        response = await client.post(f"{side.url}/v1/chat/completions", json=body)
        response.raise_for_status()
        return peer_answer(response.json(), labels)

    return lad if side.kind == "lad" else peer


def reference_side(sides: list[Side]) -> str:
    """What ratios are taken against: the peer, else our one-thread side, else the first."""
    for s in sides:
        if s.kind == PEER:
            return s.name
    for s in sides:
        if s.threads == "1":
            return s.name
    return sides[0].name


def measure(
    sides: list[Side],
    streams: dict[str, list[list[dict]]],
    levels: list[int],
    rounds: int,
    send: dict[str, Any],
) -> tuple[list[Cell], dict[str, dict[int, int | None]]]:
    """Every (stream, level): ``rounds`` chunks of the stream's payloads for that level
    (``streams[stream][k]`` for ``levels[k]``), each chunk to every side in turn (the order
    rotating by round); cells with the per-round ratio to the reference. Answers are keyed
    by the payload's place in its stream, levels one after the other."""
    ref = reference_side(sides)
    cells: list[Cell] = []
    answers: dict[str, dict[int, int | None]] = {s.name: {} for s in sides}
    for stream, per_level in streams.items():
        offset = 0
        for level, payloads in zip(levels, per_level, strict=True):
            chunks: dict[str, list[Chunk]] = {s.name: [] for s in sides}
            first, offset = offset, offset + len(payloads)
            for r in range(rounds):
                part = [(first + i, p) for i, p in enumerate(payloads) if i % rounds == r]
                order = sides[r % len(sides) :] + sides[: r % len(sides)]
                for side in order:
                    chunk = asyncio.run(_drive(send[side.name], part, level))
                    chunks[side.name].append(chunk)
                    if stream == "distinct":
                        answers[side.name].update(chunk.answers)
            for side in sides:
                cell = summarise(stream, level, side.name, chunks[side.name])
                if side.name != ref:
                    per_round = [len(c.latencies_ms) / c.elapsed_s for c in chunks[side.name]]
                    theirs = [len(c.latencies_ms) / c.elapsed_s for c in chunks[ref]]
                    cell.ratio = ratio_spread(per_round, theirs)
                cells.append(cell)
                ratio = f" ratio {cell.ratio['median']:.2f}" if cell.ratio else ""
                print(
                    f"{stream:9s} c={level:3d} {side.name:16s} {cell.requests_per_s:7.2f} req/s "
                    f"p50={cell.p50_ms:8.1f} p95={cell.p95_ms:8.1f}{ratio}",
                    flush=True,
                )
    return cells, answers


def _thread_env(setting: str) -> dict[str, str]:
    """LAD_TORCH_THREADS for a ``--threads`` item: "auto" leaves it unset (the default)."""
    return {} if setting == "auto" else {"LAD_TORCH_THREADS": setting}


def main(argv: list[str] | None = None) -> int:
    parser = command_parser(prog="lad bench peer", description=__doc__)
    parser.add_argument("--model", default="demo", help="demo, a directory, or shape:<name>")
    parser.add_argument("--width", type=int, default=None, help="shape: the text hidden size")
    parser.add_argument("--dtype", default="auto", help="LAD_DTYPE and vLLM's --dtype")
    parser.add_argument(
        "--shape-dtype", default="bfloat16", help="shape: the dtype the checkpoint is saved in"
    )
    parser.add_argument("--n", type=int, default=4, help="images per request")
    parser.add_argument("--requests", type=int, default=32, help="requests per stream and level")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds per level")
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--method", default="agd", help="our method (agd, vanilla)")
    parser.add_argument(
        "--threads",
        default="auto",
        help="our LAD_TORCH_THREADS settings, one server each "
        "(auto: unset, the default; 0: torch's default; N)",
    )
    parser.add_argument("--peer-python", help="the interpreter of vLLM's venv (starts its server)")
    parser.add_argument("--peer-shim", help="a folder put on vLLM's PYTHONPATH (vllm_shim)")
    parser.add_argument("--peer-url", help="an already running OpenAI-compatible vLLM server")
    parser.add_argument("--peer-name", default="peer", help="the model name the peer serves")
    parser.add_argument(
        "--peer-arg", action="append", default=[], help="an extra argument to vLLM's server"
    )
    parser.add_argument("--no-peer", action="store_true", help="our thread settings alone")
    parser.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "lad-peer-models"))
    parser.add_argument("--out", default="bench/results/peer.json")
    args = parser.parse_args(argv)
    with_peer = not args.no_peer and bool(args.peer_python or args.peer_url)
    if not args.no_peer and not with_peer:
        parser.error("give --peer-python (with --peer-shim) or --peer-url, or --no-peer")

    load_start = os.getloadavg()[0]
    levels = [int(c) for c in args.concurrency.split(",")]
    if args.model == "demo" and not with_peer:
        checkpoint = None  # the demo as shipped: no copy for vLLM needed
    else:
        checkpoint = prepare_checkpoint(args.model, args.width, Path(args.cache), args.shape_dtype)
    lad_model = str(checkpoint or args.model)
    labels = [str(i + 1) for i in range(args.n)]
    # distinct: fresh images at every level (a prompt seen before is a prefix-cache hit)
    distinct = build_payloads(args.requests * len(levels), args.n, seed="test")
    repeated = repeated_stream(build_payloads(REPEATED_POOL, args.n, seed="eval"), args.requests)
    per_level = args.requests
    streams = {
        "distinct": [distinct[k * per_level : (k + 1) * per_level] for k in range(len(levels))],
        "repeated": [repeated] * len(levels),
    }
    warm_up = build_payloads(2, args.n, seed="train")
    examples = build_payloads(5, args.n, seed="calibration")
    token_ids = label_token_ids(checkpoint, labels) if checkpoint and with_peer else []

    sides: list[Side] = []
    running: list[Any] = []
    workdir = Path(tempfile.mkdtemp(prefix="lad-bench-peer-"))
    try:
        for setting in args.threads.split(","):
            env = {"LAD_MODEL": lad_model, "LAD_DTYPE": args.dtype, "LAD_MAX_QUEUE": "256"}
            server = Served({**env, **_thread_env(setting)}, workdir=workdir)
            started = time.perf_counter()
            server.start(ready_timeout_s=600.0)
            running.append(server)
            name = f"lad {args.method}" + (f" threads={setting}" if "," in args.threads else "")
            sides.append(
                Side(
                    name,
                    "lad",
                    server.url,
                    server.pid,
                    time.perf_counter() - started,
                    threads=setting,
                    engine=httpx.get(f"{server.url}/readyz", timeout=10.0).json().get("model", {}),
                )
            )
            if args.method != "vanilla":
                calibrate(server.url, examples)
        if with_peer:
            if args.peer_url:
                sides.append(Side(PEER, PEER, args.peer_url.rstrip("/"), None, float("nan")))
            else:
                assert checkpoint is not None
                peer = PeerServer(
                    args.peer_python,
                    checkpoint,
                    free_port(),
                    shim=args.peer_shim,
                    dtype=args.dtype,
                    max_images=args.n,
                    served_name=args.peer_name,
                    workdir=workdir,
                    extra=args.peer_arg,
                )
                running.append(peer)
                peer.start()
                sides.append(Side(PEER, PEER, peer.url, peer.pid, peer.startup_s))
        send = {s.name: sender(s, args.method, labels, token_ids, args.peer_name) for s in sides}
        for s in sides:  # warm-up: one request of each stream
            asyncio.run(_drive(send[s.name], list(enumerate(warm_up)), 1))
        peaks = {s.name: TreePeak(s.pid) for s in sides if s.pid is not None}
        for p in peaks.values():
            p.__enter__()
        try:
            cells, answers = measure(sides, streams, levels, args.rounds, send)
        finally:
            for p in peaks.values():
                p.__exit__()
        for s in sides:
            if s.name in peaks:
                s.peak_rss_mib = peaks[s.name].peak
    except BaseException:
        print(f"the servers' logs are in {workdir}", flush=True)
        raise
    finally:
        for server in running:
            server.stop()
    shutil.rmtree(workdir, ignore_errors=True)

    ref = reference_side(sides)
    agree = None
    if with_peer:
        ours = next(s.name for s in sides if s.kind == "lad")
        agree = agreement(answers[ours], answers[PEER])
    record: dict[str, Any] = {
        "command": "lad bench peer " + " ".join(argv or []),
        "model": args.model,
        "width": args.width,
        "dtype": args.dtype,
        "n_images": args.n,
        "image": "224x224 JPEG",
        "method": args.method,
        "rounds": args.rounds,
        "requests_per_level": args.requests,
        "concurrency": levels,
        "reference": ref,
        **conditions(load_start),
        "sides": [asdict(s) for s in sides],
        "cells": [asdict(c) for c in cells],
        "agreement": agree,
    }
    record["table"] = render(record)
    print(record["table"])
    write_record(args.out, record)
    return 0
