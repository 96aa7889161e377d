"""``lad bench soak --minutes M``: the service under steady mixed traffic for M minutes.

Starts `lad serve` (the demo model unless --model) on loopback, calibrates one profile, then
keeps --concurrency clients sending retrieval requests (agd 70 %, vanilla 20 %, perm_avg
10 %, four 224x224 JPEGs of the synthetic world each) while one more client recalibrates
every --calibrate-every-s seconds. Reports per minute: requests, throughput, errors
(anything but 200), p50 / p99 latency and the resident memory at the minute's end; and
the resident memory at the start (after warm-up) and at the end. Targets (issue 10):
0 errors, RSS growth < 5 %. With --hostile-share F, that share of the clients' requests
are the hostile classes of ``lad bench hardening`` at a tenth of their size (counted as
errors only when not answered as they should be; issue 19: memory stays flat), with issue
29's classes at a small size (a stream of invented profile names among them).
Bounded in time; loopback only. Writes JSON under bench/results/.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from app.cli_help import command_parser
from lad_lab.bench import hardening
from lad_lab.bench.live import Served
from lad_lab.bench.results import write_record
from lad_lab.bench.service import build_payloads

METHOD_MIX = (("agd", 0.7), ("vanilla", 0.2), ("perm_avg", 0.1))


@dataclass
class Minute:
    """What happened in one minute of the soak."""

    requests: int = 0
    errors: int = 0
    calibrations: int = 0
    hostile: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)

    def row(self, index: int, rss_mib: float, seconds: float) -> dict[str, Any]:
        lat = np.asarray(self.latencies_ms) if self.latencies_ms else np.zeros(1)
        return {
            "minute": index + 1,
            "requests": self.requests,
            "requests_per_s": round(self.requests / seconds, 2),
            "errors": self.errors,
            "calibrations": self.calibrations,
            "hostile": self.hostile,
            "p50_ms": round(float(np.percentile(lat, 50)), 1),
            "p99_ms": round(float(np.percentile(lat, 99)), 1),
            "rss_mib": round(rss_mib, 1),
            "statuses": dict(self.statuses),
        }


class Soak:
    """The traffic: client threads append into the current minute under one lock."""

    def __init__(
        self,
        served: Served,
        payloads: list[dict],
        examples: list[dict],
        seed: int,
        hostile_share: float = 0.0,
    ) -> None:
        self.served, self.payloads, self.examples = served, payloads, examples
        self.hostile_share = hostile_share
        self.hostile = (
            {**hardening.cases(200_000, 300_000), **hardening.cases29_small()}
            if hostile_share > 0
            else {}
        )
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.minute = Minute()
        self.stop = threading.Event()

    def _record(self, status: int, latency_ms: float, calibration: bool = False) -> None:
        with self.lock:
            m = self.minute
            m.statuses[str(status)] = m.statuses.get(str(status), 0) + 1
            if calibration:
                m.calibrations += 1
            else:
                m.requests += 1
                m.latencies_ms.append(latency_ms)
            if status != 200:
                m.errors += 1

    def _method(self) -> str:
        pick, acc = self.rng.random(), 0.0
        for method, share in METHOD_MIX:
            acc += share
            if pick < acc:
                return method
        return METHOD_MIX[0][0]

    def _hostile_request(self) -> None:
        case = self.rng.choice(sorted(self.hostile))
        try:
            status = self.hostile[case][0](self.served.url)
        except httpx.HTTPError:
            status = 0
        with self.lock:
            m = self.minute
            m.statuses[f"hostile {status}"] = m.statuses.get(f"hostile {status}", 0) + 1
            m.hostile += 1
            m.errors += 0 if hardening.expected(case, status) else 1

    def client(self) -> None:
        with httpx.Client(base_url=self.served.url, timeout=120.0) as http:
            while not self.stop.is_set():
                if self.hostile and self.rng.random() < self.hostile_share:
                    self._hostile_request()
                    continue
                payload = self.rng.choice(self.payloads)
                body = {
                    "query": payload["query"],
                    "images": payload["images"],
                    "method": self._method(),
                }
                start = time.perf_counter()
                try:
                    status = http.post("/v1/retrieve", json=body).status_code
                except httpx.HTTPError:
                    status = 0
                self._record(status, (time.perf_counter() - start) * 1e3)

    def calibrator(self, every_s: float) -> None:
        with httpx.Client(base_url=self.served.url, timeout=300.0) as http:
            while not self.stop.wait(every_s):
                start = time.perf_counter()
                try:
                    status = http.post("/v1/calibrate", json={"examples": self.examples})
                    code = status.status_code
                except httpx.HTTPError:
                    code = 0
                self._record(code, (time.perf_counter() - start) * 1e3, calibration=True)

    def next_minute(self) -> Minute:
        with self.lock:
            done, self.minute = self.minute, Minute()
        return done


def run(
    minutes: float,
    concurrency: int,
    model: str,
    threads: int,
    every_s: float,
    seed: int,
    hostile_share: float = 0.0,
) -> dict[str, Any]:
    payloads = build_payloads(32, 4, seed="eval")
    examples = [
        {"query": p["query"], "images": p["images"], "answer": p["answer"]}
        for p in build_payloads(5, 4, seed="calibration")
    ]
    env = {"LAD_MODEL": model, "LAD_TORCH_THREADS": str(threads)}
    with Served(env) as served:
        calibrated = httpx.post(
            f"{served.url}/v1/calibrate", json={"examples": examples}, timeout=300.0
        )
        calibrated.raise_for_status()
        soak = Soak(served, payloads, examples, seed, hostile_share)
        for payload in payloads[:8]:  # warm-up before the start RSS
            httpx.post(
                f"{served.url}/v1/retrieve",
                json={"query": payload["query"], "images": payload["images"]},
                timeout=120.0,
            )
        rss_start = served.rss_mib()
        workers = [threading.Thread(target=soak.client, daemon=True) for _ in range(concurrency)]
        workers.append(threading.Thread(target=soak.calibrator, args=(every_s,), daemon=True))
        for w in workers:
            w.start()
        rows: list[dict[str, Any]] = []
        began = time.monotonic()
        while (elapsed := time.monotonic() - began) < minutes * 60:
            step = min(60.0, minutes * 60 - elapsed)
            time.sleep(step)
            rows.append(soak.next_minute().row(len(rows), served.rss_mib(), step))
            print(_line(rows[-1]), flush=True)
        soak.stop.set()
        for w in workers:
            w.join(180)
        rss_end = served.rss_mib()
    total = sum(r["requests"] for r in rows)
    return {
        "model": model,
        "minutes": minutes,
        "concurrency": concurrency,
        "threads": threads,
        "calibrate_every_s": every_s,
        "method_mix": dict(METHOD_MIX),
        "rows": rows,
        "hostile_share": hostile_share,
        "hostile": sum(r["hostile"] for r in rows),
        "requests": total,
        "errors": sum(r["errors"] for r in rows),
        "calibrations": sum(r["calibrations"] for r in rows),
        "requests_per_s": round(total / (minutes * 60), 2),
        "rss_start_mib": round(rss_start, 1),
        "rss_end_mib": round(rss_end, 1),
        "rss_growth_pct": round(100 * (rss_end - rss_start) / rss_start, 2),
    }


def _line(r: dict[str, Any]) -> str:
    return (
        f"| {r['minute']} | {r['requests']} | {r['requests_per_s']} | {r['errors']} | "
        f"{r['calibrations']} | {r['p50_ms']} | {r['p99_ms']} | {r['rss_mib']} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = command_parser(prog="lad bench soak", description=__doc__, raw_description=True)
    parser.add_argument("--minutes", type=float, default=10.0, help="duration (default 10)")
    parser.add_argument("--concurrency", type=int, default=4, help="retrieval clients (4)")
    parser.add_argument("--model", default="demo", help="model to serve (default: demo)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the server")
    parser.add_argument(
        "--calibrate-every-s",
        type=float,
        default=60.0,
        help="seconds between recalibrations (default 60)",
    )
    parser.add_argument(
        "--hostile-share",
        type=float,
        default=0.0,
        help="share of requests that are hostile (lad bench hardening's)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench/results/soak_demo.json")
    args = parser.parse_args(argv)
    if not 0 < args.minutes <= 240:
        parser.error("--minutes must be in (0, 240]")
    print("| minute | requests | req/s | errors | calibrations | p50 ms | p99 ms | RSS MiB |")
    print("|--:|--:|--:|--:|--:|--:|--:|--:|")
    record = run(
        args.minutes,
        args.concurrency,
        args.model,
        args.threads,
        args.calibrate_every_s,
        args.seed,
        args.hostile_share,
    )
    print(
        f"{record['requests']} requests ({record['requests_per_s']} req/s), "
        f"{record['errors']} errors, {record['calibrations']} calibrations; RSS "
        f"{record['rss_start_mib']} -> {record['rss_end_mib']} MiB "
        f"({record['rss_growth_pct']:+} %)"
    )
    write_record(args.out, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
