"""``lad bench host-memory``: what the C heap's policy costs a CPU forward, side by side.

glibc's settings hold for a whole process and are taken before its threads start, so each
policy runs in a child process of its own, the policies alternating round by round (the
order rotates); each child builds the model, runs a batch of ``--rows`` prompts of ``--n``
images on a worker thread as the service does (a warm-up, then ``--forwards`` timed), and
reports per forward its wall time, system CPU time and minor page faults, then its resident
memory after the forwards and after ``release_free_memory`` (what the idle worker returns).
Policies (``app.engine.host_memory``): ``retain`` (the service's default), ``map_apart``
(``LAD_HOST_MEMORY_RETAIN_S=0``, the service's policy before) and ``glibc`` (glibc's own
defaults, which the in-process benchmarks ran under), and ``retain_scheduled``: retention
with the busy worker's release schedule (``ReleaseSchedule`` after every forward, inside its
timed wall, as the model worker runs it; ``--trim-every-s``, ``--trim-above-mb``,
``--trim-min-batches``), which shows what releasing under traffic costs the retention's
gain (``--trim-every-s 0.001 --trim-min-batches 1``: a release after every forward, the
price of one release on each). Paired ratios are per round, each
policy's median forward over ``map_apart``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np

from app.cli_help import command_parser
from app.engine import host_memory
from lad_lab.bench.engine_setup import DEVICE, QUERY, build, model_options, record_tag
from lad_lab.bench.results import MIB, device_name, rss_bytes, write_record

BASE = "map_apart"
SCHEDULED = "retain_scheduled"
BENCH_POLICIES = (*host_memory.POLICIES, SCHEDULED)


def child(args: Any) -> dict[str, Any]:
    """One policy's forwards (in this process, which applied it first)."""
    from app.engine.encoder_cache import EncoderCache
    from app.engine.interface import RetrievalItem
    from lad_lab.testing.tiny_models import random_images

    runner = build(args.model, args.side, args.threads)
    runner.encoder_cache = EncoderCache(0)  # every forward runs the tower: the same work
    sizes = [(args.side, args.side)]
    batches = [
        [
            RetrievalItem(QUERY, random_images(args.n, seed=1000 * f + r, sizes=sizes))
            for r in range(args.rows)
        ]
        for f in range(args.forwards + 1)
    ]
    rows: list[dict[str, float]] = []
    schedule = (
        host_memory.ReleaseSchedule(
            args.trim_every_s, int(args.trim_above_mb * MIB), min_batches=args.trim_min_batches
        )
        if args.child == SCHEDULED
        else None
    )

    def work() -> None:  # on a thread, as the model worker runs them
        for items in batches:
            before = resource.getrusage(resource.RUSAGE_SELF)
            start = time.perf_counter()
            runner.forward(items)
            if schedule is not None:
                schedule.after_batch()
            wall = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_SELF)
            rows.append(
                {
                    "wall_ms": wall * 1e3,
                    "sys_ms": (after.ru_stime - before.ru_stime) * 1e3,
                    "user_ms": (after.ru_utime - before.ru_utime) * 1e3,
                    "minor_faults": after.ru_minflt - before.ru_minflt,
                }
            )

    worker = threading.Thread(target=work, name="lad-model-worker")
    worker.start()
    worker.join()
    rss_busy = rss_bytes() / MIB
    host_memory.release_free_memory()
    return {
        "forwards": rows[1:],  # the first is the warm-up
        "rss_after_forwards_mib": rss_busy,
        "rss_after_release_mib": rss_bytes() / MIB,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "scheduled_releases": schedule.releases if schedule else 0,
    }


def _run_child(policy: str, argv: list[str]) -> dict[str, Any]:
    command = [sys.executable, "-m", "lad_lab.bench.host_memory", "--child", policy, *argv]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{policy} child failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(args: Any, argv: list[str]) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in args.policies}
    ratios: dict[str, list[float]] = {}
    for rnd in range(args.rounds):
        shift = rnd % len(args.policies)
        order = args.policies[shift:] + args.policies[:shift]
        got = {}
        for policy in order:
            got[policy] = _run_child(policy, argv)
            runs[policy].append(got[policy])
        medians = {
            p: float(np.median([f["wall_ms"] for f in r["forwards"]])) for p, r in got.items()
        }
        print(
            f"round {rnd + 1}: " + ", ".join(f"{p} {m:.0f} ms" for p, m in medians.items()),
            flush=True,
        )
        for policy in args.policies:
            if policy != BASE and BASE in medians:
                ratios.setdefault(f"{policy}_over_{BASE}", []).append(
                    medians[policy] / medians[BASE]
                )
    return {"runs": runs, "ratios": ratios}


def _median(values: list[float]) -> float:
    return float(np.median(values))


def render(record: dict[str, Any]) -> str:
    """Per policy: median forward wall, system time and faults over every timed forward,
    resident memory after the forwards and after the release; the paired ratio to
    map_apart (median, range over rounds)."""
    lines = [
        f"| policy | forward ms | sys ms | minor faults | RSS after forwards MiB "
        f"| RSS after release MiB | ms / {BASE} (paired, range) |",
        "|:--|--:|--:|--:|--:|--:|--:|",
    ]
    for policy, runs in record["runs"].items():
        forwards = [f for r in runs for f in r["forwards"]]
        ratio = record["ratios"].get(f"{policy}_over_{BASE}")
        paired = (
            f"{_median(ratio):.3f} ({min(ratio):.2f}–{max(ratio):.2f})" if ratio else "1 (the base)"
        )
        lines.append(
            f"| {policy} | {_median([f['wall_ms'] for f in forwards]):.0f} | "
            f"{_median([f['sys_ms'] for f in forwards]):.0f} | "
            f"{_median([f['minor_faults'] for f in forwards]):.0f} | "
            f"{_median([r['rss_after_forwards_mib'] for r in runs]):.0f} | "
            f"{_median([r['rss_after_release_mib'] for r in runs]):.0f} | {paired} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = command_parser(prog="lad bench host-memory", description=__doc__)
    parser.add_argument("--rows", type=int, default=6, help="prompts per forward")
    parser.add_argument("--n", type=int, default=11, help="images per prompt")
    parser.add_argument("--side", type=int, default=280, help="image side (pixels)")
    parser.add_argument("--forwards", type=int, default=3, help="timed forwards per child")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of one child per policy")
    parser.add_argument(
        "--policies",
        default=",".join(host_memory.POLICIES),
        help=f"comma list of {', '.join(BENCH_POLICIES)}",
    )
    parser.add_argument(
        "--trim-every-s", type=float, default=5.0, help=f"{SCHEDULED}: release period (s)"
    )
    parser.add_argument(
        "--trim-above-mb", type=float, default=1024, help=f"{SCHEDULED}: release trigger (MiB)"
    )
    parser.add_argument(
        "--trim-min-batches",
        type=int,
        default=host_memory.RELEASE_MIN_BATCHES,
        help=f"{SCHEDULED}: forwards between releases at least (1: after every forward, "
        "the worst case)",
    )
    parser.add_argument("--child", choices=BENCH_POLICIES, help=argparse.SUPPRESS)
    parser.add_argument(
        "--out", help="record path (default bench/results/host_memory_<model>.json)"
    )
    model_options(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    DEVICE.update(device=args.device, dtype=args.dtype, width=args.width)
    if args.child:
        # first: before torch starts its threads
        host_memory.apply("retain" if args.child == SCHEDULED else args.child)
        print(json.dumps(child(args)))
        return 0
    args.policies = args.policies.split(",")
    unknown = set(args.policies) - set(BENCH_POLICIES)
    if unknown:
        parser.error(f"unknown policies {sorted(unknown)}")
    load_start = os.getloadavg()[0]
    result = measure(args, argv)
    record = {
        "command": "lad bench host-memory " + " ".join(argv),
        "model": args.model,
        "width": args.width,
        "device": device_name(args.device),
        "dtype": args.dtype,
        "torch_threads": args.threads,
        "load_avg_1min": {"start": load_start, "end": os.getloadavg()[0]},
        "rows": args.rows,
        "n": args.n,
        "side": args.side,
        "schedule": {
            "trim_every_s": args.trim_every_s,
            "trim_above_mb": args.trim_above_mb,
            "trim_min_batches": args.trim_min_batches,
        },
        **result,
    }
    record["table"] = render(record)
    print(record["table"])
    tag = record_tag(args.model, args.width)
    write_record(args.out or f"bench/results/host_memory_{tag}.json", record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
