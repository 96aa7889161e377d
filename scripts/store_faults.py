"""Measure the store fault bounds of issue 19 (items 4, 5, 10) on a redis-server of its own.

    .venv/bin/python scripts/store_faults.py [--out bench/results/store_faults.json]

Prints and writes: the held-out share among ids an attacker picks by the old rule and the
cost of the server's draw; how long a replica (default poll, 5 s) takes to follow a Redis
that restarted empty and to pick up a key repaired after it vanished; the cost of the
write probe and how long readiness takes to see a Redis at maxmemory.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import redis

from calibration_store import Evidence, Profile, ProfileKey
from calibration_store.local import FileProfileStore
from calibration_store.redis_store import RedisProfileStore, encode_key


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _server(port: int, directory: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(directory),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port, socket_connect_timeout=0.2)
    while True:
        try:
            if client.ping():
                client.close()
                return proc
        except redis.RedisError:
            time.sleep(0.02)


def _until(predicate: Any, timeout: float = 30.0) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise TimeoutError("condition not met")
        time.sleep(0.005)
    return time.monotonic() - start


def _profile(name: str = "default", seed: int = 0) -> Profile:
    rng = np.random.default_rng(seed)
    return Profile.create(
        name=name,
        fingerprint={
            "model_id": "m",
            "model_revision": "r",
            "dtype": "float32",
            "attention_backend": "sdpa",
            "prompt_hash": "p" * 16,
            "label_scheme": "digits",
            "n": 3,
        },
        layers=[0, 1],
        bias_matrix=rng.normal(size=(3, 3)),
        attention_prior=rng.random((2, 3)),
        num_examples=5,
        num_forward_passes=15,
    )


def held_out_share(ids: int) -> dict[str, Any]:
    key = ProfileKey(model_id="m", name="default", label_scheme="digits", n=3)
    picked = [
        r
        for r in (f"pick-{i}" for i in range(ids * 6))
        if hashlib.sha256(r.encode()).digest()[0] % 5 == 0
    ][:ids]
    held = sum(Evidence.of(key, 1, np.zeros(3), np.ones((2, 3))).held_out for _ in picked)
    scores, attention = np.zeros(3), np.ones((2, 3))
    timings = {}
    for name, held_out in (("drawn", None), ("fixed", False)):
        start = time.perf_counter()
        for _ in range(20_000):
            Evidence.of(key, 1, scores, attention, held_out)
        timings[name] = (time.perf_counter() - start) / 20_000 * 1e6
    return {
        "attacker_ids": len(picked),
        "held_out": held,
        "share": held / len(picked),
        "old_rule_share": 1.0,
        "evidence_of_us": {k: round(v, 2) for k, v in timings.items()},
    }


def restart_empty(port: int, directory: Path, trials: int) -> dict[str, Any]:
    follow, versions = [], []
    for t in range(trials):
        proc = _server(port, directory)
        a = RedisProfileStore(f"redis://127.0.0.1:{port}/0", key_prefix=f"m{t}")
        key = a.put(_profile()).key
        a.put(_profile(seed=1))
        proc.kill()
        proc.wait()
        proc = _server(port, directory)
        start = time.monotonic()
        _until(lambda a=a, key=key: a.get(key) is None and a.store_resets == 1)
        follow.append(time.monotonic() - start)
        fresh = RedisProfileStore(f"redis://127.0.0.1:{port}/0", key_prefix=f"m{t}", listen=False)
        versions.append(fresh.put(_profile(seed=2)).version)
        fresh.close()
        a.close()
        proc.kill()
        proc.wait()
    return {
        "trials": trials,
        "follow_s": [round(x, 3) for x in follow],
        "fresh_replica_version_after_v2": versions,
    }


def vanished(port: int, directory: Path, trials: int) -> dict[str, Any]:
    proc = _server(port, directory)
    url = f"redis://127.0.0.1:{port}/0"
    a, b = RedisProfileStore(url, key_prefix="v"), RedisProfileStore(url, key_prefix="v")
    key = a.put(_profile()).key
    a.put(_profile("other"))
    admin = redis.Redis(port=port)
    pointer = f"v:current:{encode_key(key)}"
    pickup = []
    for _ in range(trials):
        _until(lambda: b.get(key) is not None)
        saved = admin.dump(pointer)
        admin.delete(pointer)
        _until(lambda: b.get(key) is None)
        admin.restore(pointer, 0, saved)
        pickup.append(_until(lambda: b.get(key) is not None))
    a.close()
    b.close()
    admin.close()
    proc.kill()
    proc.wait()
    return {
        "trials": trials,
        "poll_interval_s": 5.0,
        "repair_pickup_s": [round(x, 3) for x in pickup],
    }


def writes(port: int, directory: Path) -> dict[str, Any]:
    import calibration_store.base as base

    proc = _server(port, directory)
    store = RedisProfileStore(f"redis://127.0.0.1:{port}/0", key_prefix="w")
    probe = []
    base_every = base.WRITE_PROBE_EVERY_S
    base.WRITE_PROBE_EVERY_S = 0.0
    for _ in range(200):
        start = time.perf_counter()
        store.check_writes()
        probe.append((time.perf_counter() - start) * 1000)
    with tempfile.TemporaryDirectory() as root:
        files = FileProfileStore(root)
        file_probe = []
        for _ in range(200):
            start = time.perf_counter()
            files.check_writes()
            file_probe.append((time.perf_counter() - start) * 1000)
        files.close()
    base.WRITE_PROBE_EVERY_S = base_every
    admin = redis.Redis(port=port)
    store.check_writes()
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", "1")
    start = time.monotonic()  # a readiness probe every second, as a kubelet might
    while store.health()["writes"] != "failing":
        store.check_writes()
        time.sleep(1.0)
    seen = time.monotonic() - start
    admin.close()
    store.close()
    proc.kill()
    proc.wait()
    return {
        "probe_ms_redis_median": round(statistics.median(probe), 3),
        "probe_ms_redis_max": round(max(probe), 3),
        "probe_ms_file_median": round(statistics.median(file_probe), 3),
        "probe_ms_file_max": round(max(file_probe), 3),
        "maxmemory_seen_by_readiness_s": round(seen, 2),
        "probe_every_s": base_every,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/store_faults.json")
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="lad-store-faults-"))
    port = _port()
    try:
        results = {
            "held_out": held_out_share(2000),
            "restart_empty": restart_empty(port, directory, args.trials),
            "vanished_key": vanished(port, directory, args.trials),
            "writes": writes(port, directory),
        }
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(json.dumps(results, indent=2))
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
