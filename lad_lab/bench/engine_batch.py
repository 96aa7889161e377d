"""``lad bench engine --batch``: the runner's throughput at batch sizes B, and what one
perm_avg request costs next to one agd request.

Throughput: B distinct requests (N images each) go through ONE ``Runner.forward`` and the
AGD posterior and debiased scores of each (DESIGN §2.4), what the service's batcher does
with B queued requests; requests/s = B / the batch's median time. perm_avg: the N cyclic
rotations of one request in one batch, then the scores mapped back to image identity and
averaged (§2.5), timed against the agd request of batch 1 in the same round (paired), so
on a shared machine both see the same load. The batch sizes and perm_avg run interleaved,
round by round, the order rotating every round; round 0 is a warm-up.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from lad_lab.bench.engine_setup import build, requests, side_for, sync
from lad_lab.bench.results import write_record

PERM_AVG = "perm_avg"


@dataclass
class BatchCell:
    """One (target tokens, N, batch size) throughput cell."""

    target_tokens: int
    n: int
    prompt_tokens: int
    batch: int
    median_ms: float  # the whole batch, processor to debiased answers
    requests_per_s: float  # batch / median_ms
    reps: int
    peak_mib: float | None = None  # CUDA: the allocator's peak above the level before


@dataclass
class PermAvgCell:
    """One (target tokens, N) perm_avg cell: its latency and, paired, its ratio to agd."""

    target_tokens: int
    n: int
    prompt_tokens: int
    median_ms: float
    agd_median_ms: float
    paired_ratio_to_agd: float  # median over rounds of perm_avg / agd (batch 1)
    reps: int
    peak_mib: float | None = None  # CUDA: the allocator's peak above the level before


def _calls(runner, items, n: int, batches: Sequence[int]) -> dict[str, Callable[[], None]]:
    """The timed calls: ``batch B`` (B requests, one forward) and ``perm_avg``."""
    from app.engine.interface import RetrievalItem
    from app.method import debias
    from app.method.methods import apply_method

    rng = np.random.default_rng(0)
    bias_matrix = rng.normal(size=(n, n))  # values do not change the cost of §2.4
    prior = rng.dirichlet(np.ones(n), size=len(runner.layers))

    def batch_call(size: int) -> Callable[[], None]:
        def once() -> None:
            out = runner.forward(items[:size])
            for scores, attention in zip(out.scores, out.attention, strict=True):
                posterior = debias.attention_posterior(attention, prior)
                debias.debias_scores(scores, bias_matrix, posterior)
            sync()

        return once

    first = items[0]
    rotated = [RetrievalItem(first.query, debias.rotate(list(first.images), r)) for r in range(n)]

    def perm_avg() -> None:
        out = runner.forward(rotated)
        apply_method(PERM_AVG, out.scores[0], None, rotated_scores=np.stack(out.scores))
        sync()

    calls = {f"batch {b}": batch_call(b) for b in batches}
    calls[PERM_AVG] = perm_avg
    return calls


def measure_batches(
    runner, side: int, n: int, batches: Sequence[int], reps: int
) -> tuple[dict[int, list[float]], list[float], int, dict[str, float]]:
    """Per batch size its batch times (ms), perm_avg's times (ms), the prompt length of one
    request (N images of side x side pixels) and, on CUDA, each call's peak memory."""
    batches = sorted({int(b) for b in batches} | {1})  # batch 1 is perm_avg's pair
    items = requests(n, side, count=max(batches))
    calls = _calls(runner, items, n, batches)
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    for rnd in range(reps + 1):
        shift = rnd % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            calls[name]()
            if rnd:
                times[name].append((time.perf_counter() - start) * 1e3)
    tokens = int(runner.process(items[:1]).input_ids.shape[1])
    return {b: times[f"batch {b}"] for b in batches}, times[PERM_AVG], tokens, cuda_peaks(calls)


def cuda_peaks(calls: dict[str, Callable[[], None]]) -> dict[str, float]:
    """On CUDA, each call's allocator peak (MiB) above the level right before it; {} else."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    peaks = {}
    for name, call in calls.items():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        call()
        torch.cuda.synchronize()
        peaks[name] = (torch.cuda.max_memory_allocated() - base) / 2**20
    return peaks


def cells_of(
    target: int,
    n: int,
    tokens: int,
    by_batch: dict[int, list[float]],
    perm: list[float],
    wanted: Sequence[int],
    peaks: dict[str, float] | None = None,
) -> tuple[list[BatchCell], PermAvgCell]:
    """The cells of one (target tokens, N) from ``measure_batches``' times."""
    rows = []
    for b in sorted({int(x) for x in wanted}):
        median = float(np.median(by_batch[b]))
        peak = (peaks or {}).get(f"batch {b}")
        rows.append(
            BatchCell(target, n, tokens, b, median, b / median * 1e3, len(by_batch[b]), peak)
        )
    ratio = np.array(perm) / np.array(by_batch[1])
    perm_cell = PermAvgCell(
        target,
        n,
        tokens,
        float(np.median(perm)),
        float(np.median(by_batch[1])),
        float(np.median(ratio)),
        len(perm),
        (peaks or {}).get(PERM_AVG),
    )
    return rows, perm_cell


def render_batches(rows: Sequence[BatchCell], perms: Sequence[PermAvgCell]) -> str:
    """The throughput table, then perm_avg's latency against agd."""
    lines = ["| tokens | N | batch | batch ms | requests/s | peak MiB |", "|" + "---|" * 6]
    for r in rows:
        peak = "–" if r.peak_mib is None else f"{r.peak_mib:.0f}"
        lines.append(
            f"| {r.prompt_tokens} | {r.n} | {r.batch} | {r.median_ms:.1f} | "
            f"{r.requests_per_s:.2f} | {peak} |"
        )
    lines += ["", "| tokens | N | perm_avg ms | agd ms | perm_avg / agd paired |", "|" + "---|" * 5]
    for p in perms:
        lines.append(
            f"| {p.prompt_tokens} | {p.n} | {p.median_ms:.1f} | {p.agd_median_ms:.1f} | "
            f"{p.paired_ratio_to_agd:.2f} |"
        )
    return "\n".join(lines)


def measure_throughput(args: argparse.Namespace, record: Callable[..., dict]) -> None:
    """``--batch``: every (prompt length, N) at every batch size, and perm_avg, in process;
    ``record(cells, layers, complete)`` is the run's record, rewritten to ``args.out``
    after each (length, N) so a run stopped by a time limit keeps what it measured."""
    wanted = [int(b) for b in args.batch.split(",")]
    rows: list[BatchCell] = []
    perms: list[PermAvgCell] = []
    done: dict = {}
    for target in (int(t) for t in args.tokens.split(",")):
        for n in (int(x) for x in args.n.split(",")):
            side, _ = side_for(args.model, target, n, args.threads)
            runner = build(args.model, side, args.threads)
            by_batch, perm, tokens, peaks = measure_batches(runner, side, n, wanted, args.reps)
            batch_rows, perm_cell = cells_of(target, n, tokens, by_batch, perm, wanted, peaks)
            rows += batch_rows
            perms.append(perm_cell)
            for r in batch_rows:
                print(
                    f"tokens~{target} ({tokens}) N={n} batch {r.batch:3d}  {r.median_ms:9.1f} ms"
                    f"  {r.requests_per_s:8.2f} requests/s",
                    flush=True,
                )
            print(
                f"tokens~{target} ({tokens}) N={n} perm_avg {perm_cell.median_ms:9.1f} ms  "
                f"/ agd {perm_cell.paired_ratio_to_agd:.2f} (paired)",
                flush=True,
            )
            done = record([], list(runner.layers), False)
            done.update(
                batches=[asdict(r) for r in rows],
                perm_avg=[asdict(p) for p in perms],
                table=render_batches(rows, perms),
            )
            write_record(args.out, done)
    done["complete"] = True
    print(done["table"])
    write_record(args.out, done)
