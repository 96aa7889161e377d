"""The per-stage rows of ``lad bench service``: one request shape at a time on the
batching server (concurrency 1), the median milliseconds of every stage the service times,
its fixed path, and perm_avg against vanilla, paired."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import httpx
import numpy as np

from app.service.pipeline import TIMINGS

SERVER_STAGES = tuple("image_decode" if key == "decode" else key for key in TIMINGS)
"""What the server times (``timings_ms``' keys, from the service's one tuple of stages),
disjoint: image_decode = decode - base64 (decode includes it)."""
FIXED_STAGES = ("http_json", "base64", "image_decode", "process", "encode")
"""The fixed path of a request: what it costs around the model, however fast the model."""


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
        Detail(
            name=f"{m}, {n} x 224²",
            method=m,
            n_images=n,
            image=small,
            requests=len(results[m]),
            p50_ms=stage_breakdown(results[m])["latency"],
            stages_ms=stage_breakdown(results[m]),
        )
        for m in SMALL_METHODS
    ]
    ratios = [p[0] / v[0] for p, v in zip(results["perm_avg"], results["vanilla"], strict=True)]
    if large:
        got = asyncio.run(_one_by_one(url, [(p, "vanilla") for p in large[:1] + large]))[1:]
        stages = stage_breakdown(got)
        details.append(
            Detail(
                name="vanilla, 12 x 4096²",
                method="vanilla",
                n_images=12,
                image="4096x4096 JPEG",
                requests=len(got),
                p50_ms=stages["latency"],
                stages_ms=stages,
            )
        )
    return details, float(np.median(ratios))


def render_details(details: list[Detail]) -> str:
    cols = (
        "latency",
        "client",
        "http_json",
        "base64",
        "image_decode",
        "process",
        "queue",
        "forward",
        "score",
        "debias",
        "encode",
        "fixed",
    )
    head = (
        "| request (concurrency 1, median ms) | latency | client | HTTP+JSON | base64 "
        "| image decode | processor | queue | forward | score | debias | encode "
        "| fixed path |"
    )
    lines = [head, "|:--|" + "--:|" * len(cols)]
    for d in details:
        cells = (f"{d.stages_ms[c]:.2f}" if c in d.stages_ms else "–" for c in cols)
        lines.append(f"| {d.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
