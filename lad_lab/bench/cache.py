"""``lad bench cache``: what the encoder cache saves, side by side with it off, in one run.

One process, one runner, the cache switched between off (``LAD_ENCODER_CACHE_MB=0``) and on
(``--cache-mb``) between calls; every round draws fresh random images, so a round's hits
come from that round's own repeats only. Measured, interleaved round by round (the order
rotates, paired ratios are per round):

* ``vanilla``: one forward of N images, cache off, and on (cold: every image a miss, so
  this is the cache's own cost: hashing and copying), with the vision share V of that
  forward (``get_image_features`` on its pixels, timed alone) and L = forward − V;
* ``perm_avg``: the N cyclic orderings as N forwards of one request each (what a busy
  batcher runs), off and on; the limit with the cache is (V + N·L) / (N·(V + L));
* ``rerank``: a windowed tournament over ``--rerank-docs`` documents (window
  ``--window``, top 2 advancing; the windows of a round in batches of ``--max-batch``),
  with its limit 1 − h·V_r/T_r: h the share of its image units that hit (only the rounds
  after the first can), V_r the time its tower calls took in the cache-off run (timed
  inside it) and T_r that run's time; each run's tower time is recorded beside its total;
* ``zipf``: a replayed stream of ``--stream`` requests of N = 4 candidates drawn from a
  catalogue of ``--catalogue`` images with Zipf popularity (exponent ``--zipf``),
  throughput off vs on (a fresh cache per replay);
* memory at the bound: a cache of ``--bound-entries`` images' worth filled with twice as
  many unique ones: its bytes, entries, evictions, and the process's growth.

The process runs under the C heap policy ``lad serve`` sets by default (``--host-memory``;
``app.engine.host_memory``), so the forwards cost what the service's do.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from app.cli_help import command_parser
from app.engine import host_memory
from app.settings import Settings
from lad_lab.bench.engine_setup import DEVICE, QUERY, build, model_options, record_tag, sync
from lad_lab.bench.results import MIB, device_name, rss_bytes, write_record


def _images(n: int, side: int, seed: int) -> list:
    from lad_lab.testing.tiny_models import random_images

    return random_images(n, seed=seed, sizes=[(side, side)])


class Bench:
    """The runner with two caches to switch between, and the timed calls."""

    def __init__(self, runner: Any, cache_mb: float) -> None:
        from app.engine.encoder_cache import EncoderCache

        self.runner = runner
        self.cache_mb = cache_mb
        self.off = EncoderCache(0, runner.encoder_cache.fingerprint)
        self.on = EncoderCache(cache_mb, runner.encoder_cache.fingerprint)

    def use(self, on: bool, fresh: bool = False) -> None:
        from app.engine.encoder_cache import EncoderCache

        if fresh:
            self.on = EncoderCache(self.cache_mb, self.off.fingerprint)
        self.runner.encoder_cache = self.on if on else self.off

    def timed(self, call: Callable[[], Any]) -> float:
        start = time.perf_counter()
        call()
        sync()
        return (time.perf_counter() - start) * 1e3

    def vision_ms(self, images: list) -> float:
        """The tower + projector alone on one request's pixels (cache off)."""
        import torch

        from app.engine.encoder_cache import encoder_owner
        from app.engine.interface import RetrievalItem

        batch = self.runner.process([RetrievalItem(QUERY, images)])
        owner = encoder_owner(self.runner.model)
        pixels = {k: v for k, v in batch.inputs.items() if k.startswith(("pixel", "image_"))}
        with torch.inference_mode():
            return self.timed(lambda: owner.get_image_features(**pixels))

    @contextlib.contextmanager
    def tower_timer(self) -> Iterator[list[float]]:
        """Within the block, the milliseconds of every ``get_image_features`` call the
        forwards make (the class's method timed, so the cache's own calls count too)."""
        from app.engine.encoder_cache import encoder_owner

        cls = type(encoder_owner(self.runner.model))
        original = cls.get_image_features
        spent: list[float] = []

        @functools.wraps(original)  # the cache reads its signature
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = original(*args, **kwargs)
            sync()
            spent.append((time.perf_counter() - start) * 1e3)
            return out

        cls.get_image_features = timed
        try:
            yield spent
        finally:
            cls.get_image_features = original

    def forward(self, images_per_item: list[list]) -> None:
        from app.engine.interface import RetrievalItem

        self.runner.forward([RetrievalItem(QUERY, images) for images in images_per_item])

    def perm_avg(self, images: list) -> None:
        n = len(images)
        for shift in range(n):
            self.forward([[images[(i + shift) % n] for i in range(n)]])

    def rerank(self, docs: list, window: int, max_batch: int) -> int:
        """The tournament's rounds, vanilla scores as probabilities; returns its passes."""
        from app.engine.interface import RetrievalItem
        from app.method import tournament

        passes = 0

        def judge(windows: list[list[int]]) -> list[list[float]]:
            nonlocal passes
            out = []
            for start in range(0, len(windows), max_batch):
                chunk = windows[start : start + max_batch]
                items = [RetrievalItem(QUERY, [docs[i] for i in w]) for w in chunk]
                result = self.runner.forward(items)
                passes += len(chunk)
                for scores in result.scores:
                    p = np.exp(scores - scores.max())
                    out.append(list(p / p.sum()))
            return out

        tournament.run(len(docs), window, judge, top_n=2, seed=0)
        return passes


def zipf_stream(catalogue: int, requests: int, n: int, exponent: float, seed: int) -> list:
    """Candidate index lists: each request draws ``n`` distinct catalogue items with
    probability ∝ rank^-exponent."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, catalogue + 1) ** exponent
    weights /= weights.sum()
    draw = [rng.choice(catalogue, size=n, replace=False, p=weights) for _ in range(requests)]
    return [d.tolist() for d in draw]


def _median(values: list[float]) -> float:
    return float(np.median(values))


def measure(args: Any, runner: Any) -> dict[str, Any]:
    bench = Bench(runner, args.cache_mb)
    ns = [int(x) for x in args.n.split(",")]
    times: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        times.setdefault(name, []).append(value)

    for rnd in range(args.reps + 1):  # round 0 warms up
        seed = 10_000 * (rnd + 1)
        row: dict[str, float] = {}
        for n in ns:
            images = _images(n, args.side, seed + n)
            cold = _images(n, args.side, seed + n + 500)
            steps = [
                ("vanilla_off", False, lambda im=images: bench.forward([im])),
                ("vanilla_on_cold", True, lambda im=cold: bench.forward([im])),
                ("perm_avg_off", False, lambda im=images: bench.perm_avg(im)),
                ("perm_avg_on", True, lambda im=images: bench.perm_avg(im)),
            ]
            shift = rnd % len(steps)
            for name, on, call in steps[shift:] + steps[:shift]:
                bench.use(on)
                row[f"{name}_n{n}"] = bench.timed(call)
            bench.use(False)
            row[f"vision_n{n}"] = bench.vision_ms(images)
        docs = _images(args.rerank_docs, args.side, seed + 7)
        hit_share = 0.0
        order = [False, True] if rnd % 2 == 0 else [True, False]
        for on in order:
            bench.use(on)
            name = f"rerank_{'on' if on else 'off'}"
            before = (bench.on.stats.hits, bench.on.stats.misses)
            with bench.tower_timer() as tower:
                row[name] = bench.timed(lambda d=docs: bench.rerank(d, args.window, args.max_batch))
            row[f"{name}_tower"] = sum(tower)
            if on:  # the share of the tournament's image units that hit
                hits, misses = bench.on.stats.hits - before[0], bench.on.stats.misses - before[1]
                hit_share = hits / max(hits + misses, 1)
        if rnd == 0:
            continue
        for key, value in row.items():
            add(key, value)
        for n in ns:
            v = row[f"vision_n{n}"]
            lang = row[f"vanilla_off_n{n}"] - v
            ratios.setdefault(f"perm_avg_on_over_off_n{n}", []).append(
                row[f"perm_avg_on_n{n}"] / row[f"perm_avg_off_n{n}"]
            )
            ratios.setdefault(f"limit_n{n}", []).append((v + n * lang) / (n * (v + lang)))
            ratios.setdefault(f"perm_avg_off_over_vanilla_n{n}", []).append(
                row[f"perm_avg_off_n{n}"] / row[f"vanilla_off_n{n}"]
            )
            ratios.setdefault(f"perm_avg_on_over_vanilla_n{n}", []).append(
                row[f"perm_avg_on_n{n}"] / row[f"vanilla_off_n{n}"]
            )
            ratios.setdefault(f"vanilla_cold_on_over_off_n{n}", []).append(
                row[f"vanilla_on_cold_n{n}"] / row[f"vanilla_off_n{n}"]
            )
        ratios.setdefault("rerank_on_over_off", []).append(row["rerank_on"] / row["rerank_off"])
        share = row["rerank_off_tower"] / row["rerank_off"]  # the tower's share of the run
        ratios.setdefault("rerank_hit_share", []).append(hit_share)
        ratios.setdefault("rerank_limit", []).append(1 - hit_share * share)
        print(f"round {rnd}: " + ", ".join(f"{k} {v:.0f}" for k, v in row.items()), flush=True)
    stream = measure_stream(args, bench)
    bound = measure_bound(args, bench)
    bench.use(False)
    return {"times_ms": times, "ratios": ratios, "stream": stream, "bound": bound}


def measure_stream(args: Any, bench: Bench) -> dict[str, Any]:
    """A Zipf stream replayed with the cache off and on (fresh), alternating; requests/s."""
    catalogue = _images(args.catalogue, args.side, 77)
    stream = zipf_stream(args.catalogue, args.stream, 4, args.zipf, seed=5)
    rates: dict[str, list[float]] = {"off": [], "on": []}
    hit_rate = 0.0
    for rep in range(args.stream_reps):
        for on in [False, True] if rep % 2 == 0 else [True, False]:
            bench.use(on, fresh=True)
            ms = bench.timed(lambda: [bench.forward([[catalogue[i] for i in r]]) for r in stream])
            rates["on" if on else "off"].append(len(stream) / (ms / 1e3))
            if on:
                stats = bench.on.stats
                hit_rate = stats.hits / max(stats.hits + stats.misses, 1)
    paired = [b / a for a, b in zip(rates["off"], rates["on"], strict=True)]
    distinct = len({i for r in stream for i in r})
    return {
        "requests": len(stream),
        "catalogue": args.catalogue,
        "zipf": args.zipf,
        "distinct_images": distinct,
        "hit_rate": hit_rate,
        "requests_per_s": rates,
        "throughput_on_over_off": paired,
    }


def measure_bound(args: Any, bench: Bench) -> dict[str, Any]:
    """Fill a cache sized for ``bound_entries`` images with twice as many unique ones."""
    from app.engine.encoder_cache import MB, EncoderCache

    bench.use(True, fresh=True)
    bench.forward([_images(1, args.side, 3)])
    unit = bench.on.bytes
    capacity = args.bound_entries * unit
    bench.on = EncoderCache(capacity / MB, bench.off.fingerprint)
    bench.use(True)
    rss = rss_bytes() / MIB
    peak_bytes = 0
    for k in range(0, 2 * args.bound_entries, 4):
        bench.forward([_images(4, args.side, 90_000 + k)])
        peak_bytes = max(peak_bytes, bench.on.bytes)
    return {
        "unit_bytes": unit,
        "capacity_bytes": bench.on.capacity_bytes,
        "peak_bytes": peak_bytes,
        "entries": len(bench.on),
        "evictions": bench.on.stats.evictions,
        "rss_growth_mib": rss_bytes() / MIB - rss,
    }


def _range(values: list[float]) -> str:
    return f"{min(values):.2f}–{max(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"


def render(record: dict[str, Any]) -> str:
    """The record's table: costs and paired ratios (median, range over rounds)."""
    t, r = record["times_ms"], record["ratios"]
    lines = [
        "| cell | off ms | on ms | on/off paired (range) | limit (V + N·L)/(N·(V + L)) "
        "| V ms | L ms |",
        "|:--|--:|--:|--:|--:|--:|--:|",
    ]
    for n in record["n"]:
        v, off = _median(t[f"vision_n{n}"]), _median(t[f"vanilla_off_n{n}"])
        ratio, limit = r[f"perm_avg_on_over_off_n{n}"], r[f"limit_n{n}"]
        cold = r[f"vanilla_cold_on_over_off_n{n}"]
        lines.append(
            f"| vanilla N={n} (cold cache) | {off:.0f} | {_median(t[f'vanilla_on_cold_n{n}']):.0f} "
            f"| {_median(cold):.3f} ({_range(cold)}) | – | {v:.0f} | {off - v:.0f} |"
        )
        lines.append(
            f"| perm_avg N={n} | {_median(t[f'perm_avg_off_n{n}']):.0f} | "
            f"{_median(t[f'perm_avg_on_n{n}']):.0f} | {_median(ratio):.3f} ({_range(ratio)}) | "
            f"{_median(limit):.3f} ({_range(limit)}) | | |"
        )
    rr, rl = r["rerank_on_over_off"], r.get("rerank_limit")
    limit = f"{_median(rl):.3f} ({_range(rl)})" if rl else "–"
    off = _median(t["rerank_off"])
    tower = _median(t["rerank_off_tower"])  # its V and L: the cache-off run's tower and rest
    lines.append(
        f"| rerank {record['rerank_docs']} docs | {off:.0f} | "
        f"{_median(t['rerank_on']):.0f} | {_median(rr):.3f} ({_range(rr)}) | {limit} "
        f"| {tower:.0f} | {off - tower:.0f} |"
    )
    s = record["stream"]
    rates = s["requests_per_s"]
    lines.append(
        f"| Zipf stream, {s['requests']} requests (req/s; hit rate {s['hit_rate']:.2f}) | "
        f"{_median(rates['off']):.2f} | {_median(rates['on']):.2f} | "
        f"{_median(s['throughput_on_over_off']):.3f} ({_range(s['throughput_on_over_off'])}) "
        "| – | | |"
    )
    b = record["bound"]
    lines.append("")
    lines.append(
        f"At the bound: {b['entries']} entries of {b['unit_bytes']} B, peak "
        f"{b['peak_bytes']} B ≤ capacity {b['capacity_bytes']} B, {b['evictions']} "
        f"evictions; resident memory +{b['rss_growth_mib']:.1f} MiB."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = command_parser(prog="lad bench cache", description=__doc__)
    parser.add_argument("--n", default="4,12", help="numbers of images")
    parser.add_argument("--side", type=int, default=112, help="image side (pixels)")
    parser.add_argument("--reps", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--cache-mb", type=float, default=256, help="the cache's bound, MiB")
    parser.add_argument("--rerank-docs", type=int, default=64, help="documents to rerank")
    parser.add_argument("--window", type=int, default=12, help="tournament window")
    parser.add_argument("--max-batch", type=int, default=8, help="windows per forward")
    parser.add_argument("--catalogue", type=int, default=64, help="Zipf stream: images")
    parser.add_argument("--stream", type=int, default=48, help="Zipf stream: requests")
    parser.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent")
    parser.add_argument("--stream-reps", type=int, default=2, help="replays off and on")
    parser.add_argument("--bound-entries", type=int, default=32, help="cache bound in images")
    parser.add_argument(
        "--host-memory",
        choices=host_memory.POLICIES,
        default=host_memory.policy_for(Settings.model_fields["host_memory_retain_s"].default),
        help="the C heap's policy (default: lad serve's)",
    )
    parser.add_argument("--out", help="record path (default bench/results/cache_<model>.json)")
    model_options(parser)
    args = parser.parse_args(argv)
    host_memory.apply(args.host_memory)  # before torch starts its threads
    DEVICE.update(device=args.device, dtype=args.dtype, width=args.width)
    load_start = os.getloadavg()[0]
    runner = build(args.model, args.side, args.threads)
    result = measure(args, runner)
    tag = record_tag(args.model, args.width)
    record = {
        "command": "lad bench cache " + " ".join(argv or []),
        "model": args.model,
        "width": args.width,
        "device": device_name(args.device),
        "dtype": args.dtype,
        "torch_threads": args.threads,
        "host_memory": args.host_memory,
        "load_avg_1min": {"start": load_start, "end": os.getloadavg()[0]},
        "n": [int(x) for x in args.n.split(",")],
        "side": args.side,
        "prompt_tokens": {
            n: int(runner.process(_request(n, args.side)).input_ids.shape[1])
            for n in (int(x) for x in args.n.split(","))
        },
        "reps": args.reps,
        "rerank_docs": args.rerank_docs,
        "cache_mb": args.cache_mb,
        **result,
    }
    record["table"] = render(record)
    print(record["table"])
    write_record(args.out or f"bench/results/cache_{tag}.json", record)
    return 0


def _request(n: int, side: int) -> list:
    from app.engine.interface import RetrievalItem

    return [RetrievalItem(QUERY, _images(n, side, 1))]


if __name__ == "__main__":
    raise SystemExit(main())
