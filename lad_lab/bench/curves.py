"""``lad bench curves``: how the cost of vanilla, agd and perm_avg grows, drawn as pictures.

Three axes, each varied alone around one base request (N = 4 images of ``--side`` pixels,
batch 1):

* ``n``: the number of candidates N; up to ``--window`` one request, beyond it a windowed
  rerank tournament (``app.method.tournament``, top 2 advancing), as the service runs one;
* ``tokens``: the image side, i.e. the tokens per image (counted from the prompt's spans);
* ``batch``: B requests answered by one runner call (perm_avg: B·N rotated rows).

Each method is what the service computes for it: vanilla the label scores' softmax, agd the
attention posterior and the debiased scores (DESIGN §2.4; calibration values drawn at random,
which does not change the cost), perm_avg the N cyclic orderings in one batch, averaged back
to image identity (§2.5). In a tournament vanilla and agd judge ``--max-batch`` windows per
forward, perm_avg one window's N orderings per forward. The encoder cache is off unless
``--cache-mb`` is given (then cleared before every call: hits only within the call).

Latency: median over ``--reps`` rounds after a warm-up round, the methods' order rotating
every round. Peak memory, in one pass after the rounds: on CPU the resident set's peak above
its level before the call (sampled in a thread; glibc is told to map every block of 64 KiB
or more on its own, so a freed tensor leaves the resident set and a smaller call is not
hidden by a larger one before it), on CUDA the allocator's peak above the level before.
The record goes under bench/results/, the figure (``lad_lab.bench.curves_plot``) into
docs/images/.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from app.cli_help import command_parser
from app.engine.host_memory import map_blocks_apart
from lad_lab.bench.engine_setup import (
    DEVICE,
    QUERY,
    build,
    model_options,
    record_tag,
    set_side,
    sync,
)
from lad_lab.bench.results import device_name, write_record

METHODS = ("vanilla", "agd", "perm_avg")
AXES = ("n", "tokens", "batch")


class Methods:
    """One runner's answers per method, for requests and for tournaments."""

    def __init__(self, runner: Any, window: int, max_batch: int) -> None:
        self.runner = runner
        self.window = window
        self.max_batch = max_batch
        self.forwards = 0
        self._calibration: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _bias_prior(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if n not in self._calibration:
            rng = np.random.default_rng(n)
            prior = rng.dirichlet(np.ones(n), size=len(self.runner.layers))
            self._calibration[n] = (rng.normal(size=(n, n)), prior)
        return self._calibration[n]

    def answer(self, method: str, requests: list[list]) -> list[np.ndarray]:
        """Each request's probabilities under ``method`` (every request N <= window)."""
        from app.engine.interface import RetrievalItem
        from app.method import debias
        from app.method.methods import apply_method

        if method == "perm_avg":
            rows = [
                RetrievalItem(QUERY, debias.rotate(images, r))
                for images in requests
                for r in range(len(images))
            ]
            out = self.runner.forward(rows)
            self.forwards += 1
            answers, start = [], 0
            for images in requests:
                scores = np.stack(out.scores[start : start + len(images)])
                answers.append(apply_method(method, scores[0], None, rotated_scores=scores))
                start += len(images)
            return [a.probabilities for a in answers]
        out = self.runner.forward([RetrievalItem(QUERY, images) for images in requests])
        self.forwards += 1
        if method == "vanilla":
            return [apply_method(method, s, None).probabilities for s in out.scores]
        answers = []
        for scores, attention in zip(out.scores, out.attention, strict=True):
            bias, prior = self._bias_prior(len(scores))
            posterior = debias.attention_posterior(attention, prior)
            answers.append(debias.softmax(debias.debias_scores(scores, bias, posterior)))
        return answers

    def request(self, method: str, images: list) -> None:
        """One request over ``images``: one answer, or a tournament beyond the window."""
        if len(images) <= self.window:
            self.answer(method, [images])
            return
        from app.method import tournament

        per_forward = 1 if method == "perm_avg" else self.max_batch

        def judge(windows: list[list[int]]) -> list[list[float]]:
            out: list[list[float]] = []
            for start in range(0, len(windows), per_forward):
                chunk = windows[start : start + per_forward]
                probabilities = self.answer(method, [[images[i] for i in w] for w in chunk])
                out.extend(list(p) for p in probabilities)
            return out

        tournament.run(len(images), self.window, judge, top_n=2, seed=0)


def _images(n: int, side: int, seed: int) -> list:
    from lad_lab.testing.tiny_models import random_images

    return random_images(n, seed=seed, sizes=[(side, side)])


def points(args: Any) -> list[dict[str, int]]:
    """Every (axis, x) point with its request: n, side and batch."""
    base = {"n": args.base_n, "side": args.side, "batch": 1}
    out = [{"axis": "n", "x": n, **base, "n": n} for n in _ints(args.n)]
    out += [{"axis": "tokens", "x": s, **base, "side": s} for s in _ints(args.sides)]
    out += [{"axis": "batch", "x": b, **base, "batch": b} for b in _ints(args.batch)]
    return out


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


class Peak:
    """The peak memory (MiB) of one call above the level before it."""

    def __init__(self) -> None:
        self.cuda = DEVICE["device"].startswith("cuda")

    def measure(self, call: Callable[[], None]) -> float:
        if self.cuda:
            import torch

            sync()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            call()
            sync()
            return (torch.cuda.max_memory_allocated() - base) / 2**20
        import gc

        from lad_lab.bench.engine import PeakSampler

        gc.collect()
        with PeakSampler() as sampler:
            base = sampler.peak
            call()
        return (sampler.peak - base) / 2**20


def measure(args: Any, runner: Any) -> list[dict[str, Any]]:
    """Every point's cells (one per method): times over rounds, median, range, peak."""
    methods = Methods(runner, args.window, args.max_batch)
    cells = []
    for k, point in enumerate(points(args)):
        requests = [_images(point["n"], point["side"], 1000 * k + b) for b in range(point["batch"])]

        def call(method: str, point: dict = point, requests: list = requests) -> int:
            set_side(runner, point["side"])
            runner.encoder_cache.clear()
            before = methods.forwards
            if point["batch"] == 1:
                methods.request(method, requests[0])
            else:
                methods.answer(method, requests)
            sync()
            return methods.forwards - before

        for method in METHODS:
            cells.append({**point, "method": method, "times_ms": [], "_call": call})
    for rnd in range(args.reps + 1):  # round 0 warms up
        for k in range(0, len(cells), len(METHODS)):
            group = cells[k : k + len(METHODS)]
            shift = rnd % len(group)
            for cell in group[shift:] + group[:shift]:
                start = time.perf_counter()
                cell["forwards"] = cell["_call"](cell["method"])
                if rnd:
                    cell["times_ms"].append((time.perf_counter() - start) * 1e3)
        print(f"round {rnd} done", flush=True)
    peak = Peak()
    for cell in cells:
        call = cell.pop("_call")
        cell["peak_mib"] = peak.measure(lambda c=cell, f=call: f(c["method"]))
        cell["median_ms"] = float(np.median(cell["times_ms"]))
        cell["min_ms"], cell["max_ms"] = min(cell["times_ms"]), max(cell["times_ms"])
    for cell in cells:
        cell.update(_tokens(runner, min(cell["n"], args.window), cell["side"]))
    return cells


def _tokens(runner: Any, n: int, side: int) -> dict[str, int]:
    """The prompt's tokens for one request of ``n`` images (one window), and per image."""
    from app.engine.interface import RetrievalItem

    set_side(runner, side)
    batch = runner.process([RetrievalItem(QUERY, _images(n, side, 5))])
    spans = runner.adapter.image_spans(batch.input_ids[0], n)
    per_image = round(float(np.mean([end - start for start, end in spans])))
    return {"prompt_tokens": int(batch.input_ids.shape[1]), "tokens_per_image": per_image}


def render(record: dict[str, Any]) -> str:
    """The record's cells as one table (median ms with the range over rounds, peak MiB)."""
    labels = {"n": "N", "tokens": "tokens/image", "batch": "batch"}
    lines = [
        "| axis | value | prompt tokens | "
        + " | ".join(f"{m} ms (range)" for m in METHODS)
        + " | "
        + " | ".join(f"{m} MiB" for m in METHODS)
        + " |",
        "|:--|--:|--:|" + "--:|" * (2 * len(METHODS)),
    ]
    by = {(c["axis"], c["x"], c["method"]): c for c in record["cells"]}
    for axis in AXES:
        for x in sorted({c["x"] for c in record["cells"] if c["axis"] == axis}):
            row = [by[(axis, x, m)] for m in METHODS]
            shown = row[0]["tokens_per_image"] if axis == "tokens" else x
            times = " | ".join(
                f"{c['median_ms']:.0f} ({c['min_ms']:.0f}–{c['max_ms']:.0f})" for c in row
            )
            peaks = " | ".join(f"{c['peak_mib']:.1f}" for c in row)
            lines.append(
                f"| {labels[axis]} | {shown} | {row[0]['prompt_tokens']} | {times} | {peaks} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = command_parser(prog="lad bench curves", description=__doc__, raw_description=True)
    parser.add_argument("--n", default="2,4,8,12,24,48,64", help="the N axis")
    parser.add_argument("--sides", default="56,112,224,336", help="the tokens axis (sides)")
    parser.add_argument("--batch", default="1,2,4,8", help="the batch axis")
    parser.add_argument("--base-n", type=int, default=4, help="N on the other axes")
    parser.add_argument("--side", type=int, default=112, help="image side on the other axes")
    parser.add_argument("--window", type=int, default=12, help="tournament window")
    parser.add_argument("--max-batch", type=int, default=8, help="windows per forward")
    parser.add_argument("--reps", type=int, default=2, help="timed rounds (after a warm-up)")
    parser.add_argument("--cache-mb", type=float, default=0, help="encoder cache (0: off)")
    parser.add_argument("--out", help="record path (default bench/results/curves_<model>.json)")
    parser.add_argument("--plot", help="figure path (default docs/images/cost_<model>.png)")
    model_options(parser)
    args = parser.parse_args(argv)
    DEVICE.update(device=args.device, dtype=args.dtype, width=args.width)
    map_blocks_apart(64 * 1024)  # freed tensors leave RSS at once: the peaks read true
    from app.engine.encoder_cache import EncoderCache

    runner = build(args.model, args.side, args.threads)
    runner.encoder_cache = EncoderCache(args.cache_mb, runner.encoder_cache.fingerprint)
    tag = record_tag(args.model, args.width)
    load = os.getloadavg()[0]
    cells = measure(args, runner)
    record = {
        "command": ("lad bench curves " + " ".join(argv or [])).strip(),
        "model": args.model,
        "width": args.width,
        "device": device_name(args.device),
        "dtype": args.dtype,
        "torch_threads": args.threads,
        "load_avg_1min": {"start": load, "end": os.getloadavg()[0]},
        "reps": args.reps,
        "window": args.window,
        "max_batch": args.max_batch,
        "cache_mb": args.cache_mb,
        "peak": "cuda allocator" if args.device.startswith("cuda") else "resident set",
        "cells": cells,
    }
    print(render(record))
    write_record(args.out or f"bench/results/curves_{tag}.json", record)
    from lad_lab.bench.curves_plot import draw

    print(f"drew {draw(record, args.plot or f'docs/images/cost_{tag}.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
