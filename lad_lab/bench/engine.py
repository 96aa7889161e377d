"""``lad bench engine``: what capture + debias cost next to a plain forward, and next to eager.

Three variants of one retrieval request (batch of 1), each timed end to end from the
processor call to the answer, median over repetitions:

  (a) ``sdpa``    plain SDPA prompt forward (``logits_to_keep=1``), no capture;
  (b) ``agd``     the runner: forward with the attention row captured inside SDPA, label
                  trie scoring, then the AGD posterior and debiased scores (DESIGN §2.4);
  (c) ``eager``   the model loaded with eager attention (text and vision) and run with
                  ``output_attentions=True`` (every T x T matrix), the naive way to the
                  attention evidence.

Prompt length is set through the image size (a Qwen-style image processor gives
(side/28)^2 tokens per image), so "~300" and "~1500" tokens hold for N=4 and N=12.
Latency: the three variants run interleaved in one process, round by round, so they see
the same machine state. Peak memory: each variant in a fresh process, the resident set
sampled every 0.5 ms during three requests and reported above the level measured right
before the first one. On CUDA (``--device cuda``) everything runs in one process: the
timings synchronise the device, and peak memory is the allocator's peak
(``torch.cuda.max_memory_allocated``) above the level before the first request, per variant.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict

import numpy as np

from app.cli_help import command_parser
from lad_lab.bench.engine_cells import VARIANTS, Cell, render, spread
from lad_lab.bench.engine_setup import DEVICE, build, requests, side_for, sync
from lad_lab.bench.results import device_name, rss_bytes, write_record


class PeakSampler:
    """Samples the resident set in a thread; torch ops release the GIL, so it keeps up."""

    def __init__(self, interval_s: float = 0.0005) -> None:
        self.interval_s = interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(self.interval_s)

    def __enter__(self) -> PeakSampler:
        self.peak = rss_bytes()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


def _variant_call(runner, variant: str, items, bias_matrix, prior):
    """One request of ``variant``; switching the attention backend is not part of the call."""
    import torch

    from app.engine.attention import CAPTURE_IMPLEMENTATION, EAGER_HOOK_CAPTURE
    from app.method import debias

    model, adapter = runner.model, runner.adapter
    # agd runs on the family's capture path: lad_capture over SDPA, or eager (eager hook)
    agd = "eager" if adapter.capture == EAGER_HOOK_CAPTURE else CAPTURE_IMPLEMENTATION
    text_backend = {"sdpa": "sdpa", "agd": agd, "eager": "eager"}[variant]
    # (c) is what a user gets by loading the model with attn_implementation="eager"
    vision_backend = "eager" if variant == "eager" else "sdpa"

    def select() -> None:
        model.set_attn_implementation(adapter.attn_implementation(text_backend, vision_backend))

    def once() -> None:
        if variant == "agd":
            out = runner.forward(items)
            posterior = debias.attention_posterior(out.attention[0], prior)
            debias.debias_scores(out.scores[0], bias_matrix, posterior)
            return
        with torch.inference_mode():
            kwargs = adapter.prompt_kwargs(runner.process(items))
            extra = {"output_attentions": True} if variant == "eager" else {}
            model(**kwargs, use_cache=False, logits_to_keep=1, **extra)
            sync()

    return select, once


def _setup(model: str, side: int, n: int, threads: int, variants: Sequence[str] = VARIANTS):
    runner = build(model, side, threads)
    items = requests(n, side)
    rng = np.random.default_rng(0)
    bias_matrix = rng.normal(size=(n, n))  # values do not change the cost of §2.4
    prior = rng.dirichlet(np.ones(n), size=len(runner.layers))
    calls = {v: _variant_call(runner, v, items, bias_matrix, prior) for v in variants}
    tokens = int(runner.process(items).input_ids.shape[1])
    return calls, tokens, list(runner.layers)


def measure_latency(
    model: str, side: int, n: int, reps: int, threads: int, variants: Sequence[str] = VARIANTS
) -> dict:
    """Per-variant request times (ms), the variants interleaved round by round.

    Interleaving (and rotating the order every round) exposes the variants to the same
    machine state, which matters on a shared 2-core machine at ~10 ms per request.
    """
    variants = tuple(variants)
    calls, tokens, layers = _setup(model, side, n, threads, variants)
    times: dict[str, list[float]] = {v: [] for v in variants}
    for rnd in range(reps + 1):  # round 0 is a warm-up
        shift = rnd % len(variants)
        order = variants[shift:] + variants[:shift]
        for variant in order:
            select, once = calls[variant]
            select()
            start = time.perf_counter()
            once()
            if rnd:
                times[variant].append((time.perf_counter() - start) * 1e3)
    return {"prompt_tokens": tokens, "times_ms": times, "layers": layers}


def measure_peak(model: str, variant: str, side: int, n: int, threads: int) -> float:
    """Peak resident memory (MiB) above the level before the first request, fresh process."""
    import gc

    calls, _, _ = _setup(model, side, n, threads, (variant,))
    select, once = calls[variant]
    select()
    gc.collect()
    with PeakSampler() as sampler:
        base = sampler.peak
        for _ in range(3):
            once()
    return (sampler.peak - base) / 2**20


def measure_cuda_peaks(
    model: str, side: int, n: int, threads: int, variants: Sequence[str] = VARIANTS
) -> dict[str, float]:
    """Per variant, the CUDA allocator's peak (MiB) during three requests, above the level
    right before them (one process: the allocator's counters separate the variants)."""
    import torch

    calls, _, _ = _setup(model, side, n, threads, variants)
    peaks: dict[str, float] = {}
    for variant in variants:
        select, once = calls[variant]
        select()
        once()  # warm-up outside the measurement (kernels, workspaces)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        for _ in range(3):
            once()
        torch.cuda.synchronize()
        peaks[variant] = (torch.cuda.max_memory_allocated() - base) / 2**20
    return peaks


def _worker(args: argparse.Namespace, kind: str, variant: str, side: int, n: int):
    """Run one measurement in a fresh interpreter (so memory peaks do not mix)."""
    cmd = [
        sys.executable,
        "-m",
        "lad_lab.bench.engine",
        "--model",
        args.model,
        "--reps",
        str(args.reps),
        "--threads",
        str(args.threads),
        "--device",
        args.device,
        "--dtype",
        args.dtype,
        "--variants",
        args.variants,
        "--worker",
        kind,
        variant,
        str(side),
        str(n),
    ]
    if args.width:
        cmd += ["--width", str(args.width)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"bench worker failed: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _paired(run: dict, variant: str) -> np.ndarray:
    return np.array(run["times_ms"][variant]) / np.array(run["times_ms"]["sdpa"])


def measure_cells(
    args: argparse.Namespace, progress: Callable[[list[Cell], list[int]], object] | None = None
) -> list[Cell]:
    """Every (prompt length, N, variant) cell; the interleaved rounds are run ``--repeats``
    times, each in a fresh worker process (in process on CUDA), and the cell keeps the
    paired median of each; ``progress(cells so far, Λ)`` after each (length, N)."""
    cells: list[Cell] = []
    variants = tuple(args.variants.split(","))
    for target in (int(t) for t in args.tokens.split(",")):
        for n in (int(x) for x in args.n.split(",")):
            side, _ = side_for(args.model, target, n, args.threads)
            on_cuda = args.device.startswith("cuda")
            if on_cuda:  # in process: synchronised timings, the allocator's own peaks
                runs = [
                    measure_latency(args.model, side, n, args.reps, args.threads, variants)
                    for _ in range(args.repeats)
                ]
                peaks = measure_cuda_peaks(args.model, side, n, args.threads, variants)
            else:
                runs = [_worker(args, "latency", "-", side, n) for _ in range(args.repeats)]
            for variant in variants:
                timed = np.concatenate([run["times_ms"][variant] for run in runs])
                if on_cuda:
                    peak: float | None = peaks[variant]
                else:
                    peak = _worker(args, "memory", variant, side, n) if args.memory else None
                cell = Cell(
                    variant=variant,
                    target_tokens=target,
                    n=n,
                    prompt_tokens=runs[0]["prompt_tokens"],
                    image_side=side,
                    median_ms=float(np.median(timed)),
                    p90_ms=float(np.percentile(timed, 90)),
                    peak_mib=peak,
                    reps=args.reps * len(runs),
                    paired_ratio_to_sdpa=float(
                        np.median(np.concatenate([_paired(r, variant) for r in runs]))
                    ),
                    repeat_ratios=[float(np.median(_paired(r, variant))) for r in runs],
                )
                cells.append(cell)
                print(
                    f"tokens~{target} ({cell.prompt_tokens}) N={n} {variant:5s} "
                    f"median {cell.median_ms:8.1f} ms  paired /sdpa "
                    f"{cell.paired_ratio_to_sdpa:6.3f} {spread(cell)}  peak {cell.peak_mib} MiB",
                    flush=True,
                )
            if progress is not None:
                progress(cells, runs[0]["layers"])
    return cells


def main(argv: list[str] | None = None) -> int:
    parser = command_parser(prog="lad bench engine", description=__doc__)
    parser.add_argument(
        "--model",
        default="demo",
        help="demo (default), tiny-<family>, shape:<name> (a released architecture with "
        "random weights: lad_lab/testing/shapes/) or a path / hub name",
    )
    parser.add_argument(
        "--width",
        type=int,
        help="shape: models: the text hidden size "
        "(every width scaled alike; depth, heads and tokens kept)",
    )
    parser.add_argument("--tokens", default="300,1500", help="target prompt lengths")
    parser.add_argument("--n", default="4,12", help="numbers of images")
    parser.add_argument("--reps", type=int, default=9, help="interleaved rounds per run")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs of the rounds (fresh processes): their spread is reported",
    )
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="sdpa,agd[,eager] (eager keeps every layer's T x T matrix)",
    )
    parser.add_argument(
        "--memory",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure peak memory (one fresh process per variant)",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--device", default="cpu", help='"cpu", "cuda" or "auto"')
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16 or auto")
    parser.add_argument(
        "--batch",
        help="throughput mode: batch sizes, e.g. 1,4,16 (agd requests per forward), and "
        "perm_avg's latency; no sdpa/agd/eager cells",
    )
    parser.add_argument("--out", default="bench/results/engine.json")
    parser.add_argument(
        "--worker", nargs=4, metavar=("KIND", "VARIANT", "SIDE", "N"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    if variants[:2] != ["sdpa", "agd"] or not set(variants) <= set(VARIANTS):
        parser.error(f"--variants must start with sdpa,agd and name only {', '.join(VARIANTS)}")
    import torch

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available on this machine")
    DEVICE.update(device=args.device, dtype=args.dtype, width=args.width)

    if args.worker:
        kind, variant, side, n = args.worker
        if kind == "latency":
            result = measure_latency(
                args.model, int(side), int(n), args.reps, args.threads, variants
            )
        else:
            result = measure_peak(args.model, variant, int(side), int(n), args.threads)
        print(json.dumps(result))
        return 0

    def record(cells: list[Cell], layers: list[int], complete: bool) -> dict:
        return {
            "command": "lad bench engine " + " ".join(argv or []),
            "complete": complete,
            "model": args.model,
            "width": args.width,
            "layers": layers,  # Λ, the captured layers
            "torch_threads": args.threads,
            "cpu_count": os.cpu_count(),
            "machine": platform.machine(),
            "device": device_name(args.device),
            "dtype": args.dtype,
            "reps": args.reps,
            "repeats": args.repeats,
            "load_avg_1min": {"start": load_start, "end": os.getloadavg()[0]},
            "cells": [asdict(c) for c in cells],
            "table": render(cells),
        }

    # written after every cell too, so a run stopped by a time limit keeps what it measured
    load_start = os.getloadavg()[0]
    seen: list[int] = []

    def progress(done: list[Cell], layers: list[int]) -> None:
        seen[:] = layers
        write_record(args.out, record(done, layers, False))

    if args.batch:
        from lad_lab.bench.engine_batch import measure_throughput

        measure_throughput(args, record)
        return 0
    cells = measure_cells(args, progress)
    print(render(cells))
    print(f"Λ = {seen} ({len(seen)} layers)")
    write_record(args.out, record(cells, seen, True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
