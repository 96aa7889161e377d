"""``lad bench hardening``: what the worst request of each hostile class costs the service.

Starts `lad serve` (the demo model unless --model, JSON logs) on loopback and sends, one
class at a time, the probe's worst requests of issue 19: a 36 MB JSON body of 3 M unknown
keys, seven 8 MB JPEGs of 2 M empty APP15 segments in one form (alone, then two such
requests at once beside a normal one), a PNG whose EXIF makes Pillow warn 5,000 times,
multipart bodies with an oversized boundary or no closing boundary. For each: the status,
the time to answer, the process's peak resident memory above idle, what is still held a
few seconds later, the slowest ``/healthz`` answered meanwhile (the event loop's
responsiveness), and the bytes the request added to the log. Prints a table and writes
JSON under bench/results/. ``--round 29`` sends issue 29's classes instead: three
maximal retrieves at once (the replica's byte budget), progressive JPEGs of 256 scans, a
PNG of 7,936 iCCP chunks, a 60 KB HTTP method, and a storm of 20 calibrations with
retrieves sent meanwhile.
"""

from __future__ import annotations

import base64
import io
import itertools
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from PIL import Image

from app.cli_help import command_parser
from lad_lab.bench.live import PeakRSS, Served
from lad_lab.bench.results import write_record
from lad_lab.testing import hostile

Send = Callable[[str], int]


def _json(content: bytes) -> Send:
    def send(url: str) -> int:
        headers = {"content-type": "application/json"}
        return httpx.post(
            f"{url}/v1/retrieve", content=content, headers=headers, timeout=300.0
        ).status_code

    return send


def _form(boundary: bytes, images: list[bytes], **form: Any) -> Send:
    content = hostile.multipart_form(boundary, images, **form)
    headers = {"content-type": f"multipart/form-data; boundary={boundary.decode()}"}

    def send(url: str) -> int:
        return httpx.post(
            f"{url}/v1/retrieve", content=content, headers=headers, timeout=300.0
        ).status_code

    return send


def _normal_body() -> dict[str, Any]:
    image = base64.b64encode(hostile.small_image("PNG")).decode()
    return {"query": "a red square", "method": "vanilla", "images": [image] * 3}


WARNS = "png: EXIF of 5,000 tags that warn"
"""The one class that is a valid image (answered 200); every other is the client's fault."""


def expected(case: str, status: int) -> bool:
    """Whether ``status`` is the right answer to a request of class ``case``."""
    return status == 200 if case in (WARNS, FRESH) else 400 <= status < 500


def cases(segments: int, keys: int) -> dict[str, tuple[Send, int]]:
    """Class -> (the request, how many at once; two at once also time a normal request
    sent beside them, which the probe saw wait 53 s for the decode slots)."""
    png = hostile.small_image("PNG")
    app15 = hostile.jpeg_with_app_segments(segments)
    warning_png = hostile.png_with_exif(hostile.exif_with_broken_tags(5000))
    normal = _normal_body()
    normal["images"][1] = base64.b64encode(warning_png).decode()
    return {
        f"json: {keys // 1000}k unknown keys": (_json(hostile.json_unknown_keys(keys)), 1),
        f"jpeg: 7 x {segments // 1000}k empty APP15": (_form(b"b", [app15] * 7), 1),
        f"jpeg: 7 x {segments // 1000}k empty APP15, two at once": (_form(b"b", [app15] * 7), 2),
        WARNS: (_json(json.dumps(normal).encode()), 1),
        "png: 500k tEXt chunks": (
            _form(b"b", [png, hostile.png_with_chunks(b"tEXt", b"k\0v", 500_000), png]),
            1,
        ),
        "multipart: 300-byte boundary": (_form(b"x" * 300, [png] * 3), 1),
        "multipart: no closing boundary, cut file": (
            _form(b"b", [png] * 3, close=False, cut=60),
            1,
        ),
    }


def maximal_retrieve_body(images: int = 6) -> bytes:
    """A retrieve as large as the default limits allow: ``images`` 4096² noise JPEGs of
    7.7 MiB each (LAD_MAX_IMAGE_BYTES is 8 MiB), about 65 MB of JSON (LAD_MAX_BODY_BYTES:
    64 MiB)."""
    buffer = io.BytesIO()
    Image.effect_noise((4096, 4096), 40).convert("RGB").save(buffer, format="JPEG", quality=80)
    image = base64.b64encode(buffer.getvalue()).decode()
    body = {"query": "a red square", "method": "vanilla", "images": [image] * images}
    return json.dumps(body).encode()


def _method(method: str) -> Send:
    def send(url: str) -> int:
        return httpx.request(method, f"{url}/v1/profiles/default", timeout=60.0).status_code

    return send


def cases29() -> dict[str, tuple[Send, int]]:
    """The worst requests of issue 29's probe (round 3), each class once or as it came."""
    png = hostile.small_image("PNG")
    progressive = hostile.progressive_jpeg_with_scans(4096, 256)
    icc = hostile.png_with_icc_profiles(7936)
    return {
        "retrieve: 6 x 4096² JPEG (65 MB JSON), three at once": (
            _json(maximal_retrieve_body()),
            3,
        ),
        "jpeg: 4 x 4096² progressive, 256 scans": (_form(b"b", [progressive] * 4), 1),
        "png: 7,936 iCCP chunks (8 MB), two at once": (_form(b"b", [icc, png, png]), 2),
        "http: 60 KB method": (_method("M" * 60_000), 1),
    }


FRESH = "retrieve: vanilla under an invented profile name"
"""A valid request (200) whose profile name is new each time: it must keep no state."""


def _fresh_names() -> Send:
    names = itertools.count()

    def send(url: str) -> int:
        body = {**_normal_body(), "profile": f"invented-{next(names)}"}
        return httpx.post(f"{url}/v1/retrieve", json=body, timeout=300.0).status_code

    return send


def cases29_small() -> dict[str, tuple[Send, int]]:
    """Issue 29's classes at a small size, for the soak's hostile share."""
    png = base64.b64encode(hostile.small_image("PNG")).decode()
    duplicate = b'{"query": "x", "images": ["%s", "%s"], "method": "vanilla", "method": "agd"}'
    return {
        "jpeg: 1100² progressive, 230 scans": (
            _form(b"b", [hostile.progressive_jpeg_with_scans(1100, 230)] * 2),
            1,
        ),
        "png: 2 iCCP chunks": (_form(b"b", [hostile.png_with_icc_profiles(2)] * 2), 1),
        "http: 60 KB method": (_method("M" * 60_000), 1),
        "json: a repeated key": (_json(duplicate % (png.encode(), png.encode())), 1),
        FRESH: (_fresh_names(), 1),
    }


def _calibration_body() -> dict[str, Any]:
    image = base64.b64encode(hostile.small_image("PNG")).decode()
    examples = [{"query": "a red square", "images": [image] * 3, "answer": i % 3} for i in range(5)]
    return {"examples": examples}


def storm(served: Served, calibrations: int = 20) -> dict[str, Any]:
    """``calibrations`` concurrent calibrations of one profile and retrieves sent meanwhile
    (the probe's: every retrieve 429 while the calibrations filled the queue)."""
    retrieves: list[tuple[int, float]] = []
    with ThreadPoolExecutor(calibrations) as pool, PeakRSS(served.pid) as peak:
        start = time.perf_counter()
        futures = [
            pool.submit(
                httpx.post, f"{served.url}/v1/calibrate", json=_calibration_body(), timeout=600.0
            )
            for _ in range(calibrations)
        ]
        time.sleep(0.2)
        while not all(f.done() for f in futures):
            t0 = time.perf_counter()
            r = httpx.post(f"{served.url}/v1/retrieve", json=_normal_body(), timeout=300.0)
            retrieves.append((r.status_code, time.perf_counter() - t0))
        answers = [f.result() for f in futures]
        seconds = time.perf_counter() - start
    versions = sorted(a.json().get("version", 0) for a in answers if a.status_code == 200)
    return {
        "case": f"storm: {calibrations} calibrations at once, retrieves meanwhile",
        "concurrent": calibrations,
        "statuses": sorted({a.status_code for a in answers}),
        "unique_versions": len(set(versions)),
        "retrieve_statuses": sorted({s for s, _ in retrieves}),
        "retrieves": len(retrieves),
        "retrieve_s_max": round(max((t for _, t in retrieves), default=0.0), 3),
        "seconds_max": round(seconds, 3),
        "peak_rss_mib": round(peak.peak, 1),
    }


class _Healthz:
    """Polls /healthz every 50 ms in a thread; the slowest answer (s) while it ran."""

    def __init__(self, url: str) -> None:
        self.url, self.slowest, self._stop = url, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        with httpx.Client(timeout=120.0) as client:
            while not self._stop.is_set():
                start = time.perf_counter()
                client.get(f"{self.url}/healthz")
                self.slowest = max(self.slowest, time.perf_counter() - start)
                self._stop.wait(0.05)

    def __enter__(self) -> _Healthz:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(120)


def measure(
    served: Served, send: Send, concurrent: int, idle: float, settle_s: float, beside: bool
) -> dict[str, Any]:
    """One class: its requests at once (and, ``beside``, a normal request 0.2 s in), with
    /healthz polled all along."""
    log_before = served.log_path.stat().st_size
    timed: list[tuple[int, float]] = []
    normal: list[tuple[int, float]] = []

    def one(_: int) -> None:
        start = time.perf_counter()
        timed.append((send(served.url), time.perf_counter() - start))

    def normal_request() -> None:
        time.sleep(0.2)
        start = time.perf_counter()
        status = httpx.post(f"{served.url}/v1/retrieve", json=_normal_body(), timeout=300.0)
        normal.append((status.status_code, time.perf_counter() - start))

    with (
        PeakRSS(served.pid) as peak,
        _Healthz(served.url) as healthz,
        ThreadPoolExecutor(concurrent + 1) as pool,
    ):
        futures = [pool.submit(one, i) for i in range(concurrent)]
        if beside:
            futures.append(pool.submit(normal_request))
        for future in futures:
            future.result()
    time.sleep(settle_s)
    row = {
        "statuses": sorted(s for s, _ in timed),
        "seconds_max": round(max(t for _, t in timed), 3),
        "peak_above_idle_mib": round(peak.peak - idle, 1),
        "held_after_mib": round(served.rss_mib() - idle, 1),
        "healthz_slowest_s": round(healthz.slowest, 3),
        "log_bytes": served.log_path.stat().st_size - log_before,
    }
    if normal:
        row.update(normal_request=normal[0][0], normal_request_s=round(normal[0][1], 3))
    return row


def run(
    model: str, segments: int, keys: int, settle_s: float, round_: str = "all"
) -> dict[str, Any]:
    env = {"LAD_MODEL": model, "LAD_TORCH_THREADS": "1", "LAD_LOG_FORMAT": "json"}
    rows: list[dict[str, Any]] = []
    built = {
        **(cases(segments, keys) if round_ in ("19", "all") else {}),
        **(cases29() if round_ in ("29", "all") else {}),
    }
    with Served(env) as served:
        for _ in range(3):  # warm-up: first-request allocations are not a hostile cost
            httpx.post(f"{served.url}/v1/retrieve", json=_normal_body(), timeout=300.0)
        time.sleep(settle_s)
        idle = served.rss_mib()
        for name, (send, concurrent) in built.items():
            row = measure(served, send, concurrent, idle, settle_s, beside=concurrent > 1)
            rows.append({"case": name, "concurrent": concurrent, **row})
            print(rows[-1], flush=True)
        if round_ in ("29", "all"):
            row = storm(served)
            row["peak_above_idle_mib"] = round(row.pop("peak_rss_mib") - idle, 1)
            rows.append(row)
        final_held = round(served.rss_mib() - idle, 1)
    return {
        "model": model,
        "idle_rss_mib": round(idle, 1),
        "final_held_mib": final_held,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = command_parser(prog="lad bench hardening", description=__doc__, raw_description=True)
    parser.add_argument("--model", default="demo", help="model to serve (default: demo)")
    parser.add_argument(
        "--segments",
        type=int,
        default=2_000_000,
        help="empty APP15 segments per crafted JPEG (the probe's: 2 M, 8 MB)",
    )
    parser.add_argument(
        "--keys",
        type=int,
        default=3_000_000,
        help="unknown keys of the JSON flood (the probe's: 3 M, 36 MB)",
    )
    parser.add_argument(
        "--settle-s",
        type=float,
        default=3.0,
        help="seconds to wait before reading what is held (default 3)",
    )
    parser.add_argument(
        "--round",
        choices=("19", "29", "all"),
        default="all",
        help="the classes of issue 19, of issue 29 (round 3), or both (default)",
    )
    parser.add_argument("--out", default="bench/results/hardening_demo.json")
    args = parser.parse_args(argv)
    record = run(args.model, args.segments, args.keys, args.settle_s, args.round)
    print(f"idle RSS {record['idle_rss_mib']} MiB")
    print(
        "| case | at once | statuses | s | peak above idle MiB | held after MiB | slowest "
        "/healthz s | normal request beside s | log bytes |"
    )
    print("|:--|--:|:--|--:|--:|--:|--:|--:|--:|")
    for r in record["rows"]:
        if "retrieves" in r:  # the storm
            print(
                f"| {r['case']} | {r['concurrent']} | {','.join(map(str, r['statuses']))} "
                f"({r['unique_versions']} versions) | {r['seconds_max']} | "
                f"{r['peak_above_idle_mib']} | - | - | {r['retrieves']} retrieves: "
                f"{','.join(map(str, r['retrieve_statuses']))}, slowest {r['retrieve_s_max']} | - |"
            )
            continue
        beside = (
            f"{r['normal_request_s']} ({r['normal_request']})" if "normal_request" in r else "-"
        )
        print(
            f"| {r['case']} | {r['concurrent']} | {','.join(map(str, r['statuses']))} | "
            f"{r['seconds_max']} | {r['peak_above_idle_mib']} | {r['held_after_mib']} | "
            f"{r['healthz_slowest_s']} | {beside} | {r['log_bytes']} |"
        )
    print(f"held at the end: {record['final_held_mib']} MiB above idle")
    write_record(args.out, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
