"""``lad bench online``: what online calibration costs a request, per store backend.

Every retrieval writes its evidence (and the unlabelled statistics) into the online store
before it answers; every feedback is one atomic update. This times both calls, one at a
time as a request makes them, for the memory and file backends and, with ``--redis``, a
real Redis (the round trip and the Lua script included). Prints a table and writes JSON
under bench/results/.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from typing import Any

import numpy as np

from app.cli_help import command_parser
from calibration_store import Evidence, ProfileKey, open_online_store
from lad_lab.bench.results import write_record


def _percentiles(samples: list[float]) -> dict[str, float]:
    ms = np.asarray(samples) * 1e3
    return {
        "p50_ms": round(float(np.median(ms)), 3),
        "p95_ms": round(float(np.percentile(ms, 95)), 3),
    }


def _mark_current(url: str, prefix: str, key: ProfileKey) -> Any:
    """The profile pointer the Redis feedback script checks (as a calibration writes it)."""
    import redis

    from calibration_store.redis_store import encode_key

    client = redis.Redis.from_url(url)
    client.hset(f"{prefix}:current:{encode_key(key)}", mapping={"version": 1, "rev": 1})
    return client


def measure(url: str, key: ProfileKey, layers: int, count: int, prefix: str) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    store = open_online_store(url, key_prefix=prefix, max_entries=count + 1)
    evidence = [
        Evidence.of(key, 1, rng.normal(size=key.n), rng.random(size=(layers, key.n)))
        for _ in range(count)
    ]
    put, feedback = [], []
    for i, ev in enumerate(evidence):
        t = time.perf_counter()
        store.put_evidence(f"bench-{i}", ev)
        put.append(time.perf_counter() - t)
    for i in range(count):
        t = time.perf_counter()
        store.feedback(f"bench-{i}", i % key.n, True)
        feedback.append(time.perf_counter() - t)
    assert store.snapshot(key, layers).count == count, "every feedback must be counted"
    store.close()
    return {"put_evidence": _percentiles(put), "feedback": _percentiles(feedback)}


def main(argv: list[str] | None = None) -> int:
    p = command_parser(
        prog="lad bench online",
        description=__doc__,
    )
    p.add_argument("--n", type=int, default=12, help="candidates N per request")
    p.add_argument("--layers", type=int, default=12, help="|Λ|, layers of attention evidence")
    p.add_argument("--count", type=int, default=2000, help="requests (and feedbacks) timed")
    p.add_argument(
        "--redis", default=None, help="also time this Redis, e.g. redis://127.0.0.1:6379/15"
    )
    p.add_argument("--out", default="bench/results/online.json", help="JSON record")
    args = p.parse_args(argv)
    key = ProfileKey(model_id="bench", name="bench", label_scheme="digits", n=args.n)
    prefix = f"lad-bench-{uuid.uuid4().hex[:8]}"
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        backends = {"memory": "memory://", "file": folder}
        if args.redis:
            backends["redis"] = args.redis
        for name, url in backends.items():
            client = _mark_current(url, prefix, key) if name == "redis" else None
            try:
                rows[name] = measure(url, key, args.layers, args.count, prefix)
            finally:
                if client is not None:
                    for k in client.scan_iter(match=f"{prefix}:*"):
                        client.delete(k)
                    client.close()
    print(f"N={args.n}, |Λ|={args.layers}, {args.count} calls each, load {os.getloadavg()[0]:.1f}")
    print(f"{'backend':8s} {'put p50':>9s} {'put p95':>9s} {'fb p50':>9s} {'fb p95':>9s}  (ms)")
    for name, r in rows.items():
        print(
            f"{name:8s} {r['put_evidence']['p50_ms']:9.3f} {r['put_evidence']['p95_ms']:9.3f} "
            f"{r['feedback']['p50_ms']:9.3f} {r['feedback']['p95_ms']:9.3f}"
        )
    write_record(
        args.out,
        {
            "n": args.n,
            "layers": args.layers,
            "count": args.count,
            "load_1m": os.getloadavg()[0],
            "backends": rows,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
