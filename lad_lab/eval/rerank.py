"""``lad eval rerank``: the windowed tournament (design §2.10) and calibration of every N from
one set of examples (§2.9), measured on the same engine functions as the service.

Two parts, both with item-bootstrap 95 % CIs and paired differences on the same items:

1. **Rerank** C candidates (Random setting) with window W: top-1 accuracy, MRR of the GT in
   the tournament's full ranking, and forward passes per item (as the service spends them)
   for the vanilla, agd and perm_avg tournaments. Every method plays the same seeded
   tournament per item (same first-round windows); agd and vanilla read the same evidence
   where their windows coincide (cached forwards; the pass counts are not discounted).
   The profiles of every window size come from one ``n: "all"`` calibration on M examples
   of W candidates.
2. **Any N from one calibration**: agd at N = 4 and 8 (balanced orderings) with the
   profiles of one ``n: "all"`` calibration on M examples of 12 candidates against profiles
   calibrated on M examples of exactly N; the evidence of the evaluation items is shared,
   only the profile differs.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from app.cli_help import command_parser
from app.method.methods import MethodConfig, apply_method
from lad_lab.eval.datasets import open_dataset, open_image
from lad_lab.eval.protocol import apply_ordering, balanced_count, gt_positions, item_orderings
from lad_lab.eval.rerank_play import Evidence, calibrate_sizes, calibrated, paired, play, with_ci
from lad_lab.eval.stats import BOOTSTRAP_SAMPLES, bootstrap_indices, mean_ci

TOURNAMENT_METHODS: tuple[str, ...] = ("vanilla", "agd", "perm_avg")


def _summary(per_item: dict[str, np.ndarray], indices: np.ndarray) -> dict[str, Any]:
    return {
        name: {"mean": float(v.mean()), "ci": mean_ci(v, indices)} for name, v in per_item.items()
    }


def rerank_part(
    runner: Any, dataset: Any, args: argparse.Namespace, config: MethodConfig
) -> list[dict[str, Any]]:
    evidence, calibrations, calibration_keys = calibrated(runner, dataset, args)
    results = []
    for c in args.candidates:
        items = dataset.items(
            args.items,
            c,
            "random",
            args.eval_seed,
            exclude=calibration_keys,
        )
        indices = bootstrap_indices(len(items), args.bootstrap)
        top1 = {m: np.zeros(len(items)) for m in TOURNAMENT_METHODS}
        rr = {m: np.zeros(len(items)) for m in TOURNAMENT_METHODS}
        cost = {m: np.zeros(len(items)) for m in TOURNAMENT_METHODS}
        for i, item in enumerate(items):
            images = [open_image(im) for im in item.images]
            for m in TOURNAMENT_METHODS:
                ranking, spent = play(
                    evidence,
                    item,
                    images,
                    m,
                    args.window,
                    calibrations,
                    config,
                    seed=args.tournament_seed + i,
                )
                top1[m][i] = 100.0 * (ranking[0] == item.answer)
                rr[m][i] = 1.0 / (ranking.index(item.answer) + 1)
                cost[m][i] = spent
            print(f"C={c}: item {i + 1}/{len(items)}", file=sys.stderr, end="\r")
        results.append(
            {
                "candidates": c,
                "window": args.window,
                "items": len(items),
                "top1": _summary(top1, indices),
                "mrr": _summary(rr, indices),
                "forward_passes": {m: float(v.mean()) for m, v in cost.items()},
                "paired_top1": {
                    "agd - vanilla": paired(top1["agd"], top1["vanilla"], indices),
                    "agd - perm_avg": paired(top1["agd"], top1["perm_avg"], indices),
                },
                "paired_mrr": {"agd - vanilla": paired(rr["agd"], rr["vanilla"], indices)},
            }
        )
    return results


def multi_n_part(
    runner: Any, dataset: Any, args: argparse.Namespace, config: MethodConfig
) -> list[dict[str, Any]]:
    evidence = Evidence(runner, args.batch_size)
    wide = dataset.items(args.calibration, 12, "random", args.calibration_seed)
    derived = calibrate_sizes(evidence, wide, range(2, 13), "all")  # n: "all" on 12 candidates
    results = []
    for n in args.multi_n:
        # same split and indices: the same queries and targets, with N - 1 negatives of N
        direct_items = dataset.items(args.calibration, n, "random", args.calibration_seed)
        direct = calibrate_sizes(evidence, direct_items, [n], "direct")[n]
        calibration_keys = frozenset(i.key for i in (*wide, *direct_items))
        items = dataset.items(args.items, n, "random", args.eval_seed, exclude=calibration_keys)
        t = balanced_count(args.orderings, n)
        orderings = item_orderings(n, len(items), t, 0)
        gt = gt_positions([i.answer for i in items], orderings)
        requests = [
            (
                (it.id, *map(int, perm)),
                it.query,
                apply_ordering([open_image(im) for im in it.images], perm),
            )
            for it, perms in zip(items, orderings, strict=True)
            for perm in perms
        ]
        got = evidence.get(requests)
        s = np.stack([g[0] for g in got])
        a = np.stack([g[1] for g in got])
        acc = {}
        for name, cal in (("n=all on 12", derived[n]), (f"direct N={n}", direct)):
            pred = apply_method("agd", s, a, cal, config).probabilities.argmax(axis=1)
            acc[name] = 100.0 * (pred == gt.ravel()).reshape(len(items), t).mean(axis=1)
        vanilla = apply_method("vanilla", s, a).probabilities.argmax(axis=1)
        acc["vanilla"] = 100.0 * (vanilla == gt.ravel()).reshape(len(items), t).mean(axis=1)
        indices = bootstrap_indices(len(items), args.bootstrap)
        names = list(acc)
        results.append(
            {
                "n": n,
                "items": len(items),
                "orderings": t,
                "acc": _summary(acc, indices),
                "paired": {"derived - direct": paired(acc[names[0]], acc[names[1]], indices)},
            }
        )
    return results


def render(metrics: dict[str, Any]) -> str:
    lines = [
        "# lad eval rerank",
        "",
        "Produced by:",
        "",
        f"    {metrics['command']}",
        "",
        f"- model `{metrics['model']}`, Random setting, seeds: eval {metrics['eval_seed']}, "
        f"calibration {metrics['calibration_seed']}, tournament {metrics['tournament_seed']}"
        f", bootstrap {metrics['bootstrap']} item resamples; wall-clock "
        f"{metrics['wall_s']} s; load: {metrics['load']}",
        "- top-1: the GT is the tournament's winner; MRR: 1 / rank of the GT in the full "
        "ranking (round reached, then probability in the last window); forward passes: "
        "what the service spends per request (shared evidence is not discounted). Each "
        "item plays one seeded tournament; all methods play the same seed, so the "
        "first-round windows are the same. Profiles of every window size come from one "
        "n = all calibration on M = 5 examples of W candidates.",
        "- CIs: 95% item bootstrap; paired differences resample the same items; "
        '"inside noise" = the CI contains 0.',
        "",
    ]
    for r in metrics.get("rerank", []):
        lines += [
            f"## Rerank {r['candidates']} candidates, window {r['window']} "
            f"({r['items']} items, one seeded tournament each)",
            "",
            "| tournament | top-1 (%) [95% CI] | MRR [95% CI] | forward passes / item |",
            "|:--|--:|--:|--:|",
        ]
        for m in TOURNAMENT_METHODS:
            lines.append(
                f"| {m} | {with_ci(r['top1'][m])} | {with_ci(r['mrr'][m], 3)} | "
                f"{r['forward_passes'][m]:.1f} |"
            )
        lines += ["", "| paired (same items) | Δ | 95% CI | verdict |", "|:--|--:|--:|--:|"]
        for what, table, digits in (("top-1", r["paired_top1"], 1), ("MRR", r["paired_mrr"], 3)):
            for name, d in table.items():
                lines.append(
                    f"| {what}: {name} | {d['mean']:+.{digits}f} | "
                    f"[{d['ci'][0]:+.{digits}f}, {d['ci'][1]:+.{digits}f}] | "
                    f"{d['verdict']} |"
                )
        lines.append("")
    for r in metrics.get("multi_n", []):
        lines += [
            f"## agd at N = {r['n']}: profile from n = all on 12 candidates vs calibrated "
            f"at N = {r['n']} ({r['items']} items x {r['orderings']} orderings)",
            "",
            "| profile | Acc (%) [95% CI] |",
            "|:--|--:|",
        ]
        lines += [f"| {name} | {with_ci(x)} |" for name, x in r["acc"].items()]
        d = r["paired"]["derived - direct"]
        lines += [
            "",
            f"Paired derived − direct: {d['mean']:+.1f} points "
            f"[{d['ci'][0]:+.1f}, {d['ci'][1]:+.1f}], {d['verdict']}.",
            "",
        ]
    if metrics.get("ranking"):
        from lad_lab.eval.rerank_ranking import render as render_ranking

        lines += render_ranking(metrics["ranking"])
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(prog="lad eval rerank", description=__doc__.split("\n\n")[0])
    add = p.add_argument
    add("--model", default="demo")
    add("--candidates", type=int, nargs="*", default=[16, 32], help="C to rerank")
    add("--window", type=int, default=8, help="largest window W")
    add("--multi-n", type=int, nargs="*", default=[4, 8], help="N for the n=all comparison")
    add(
        "--ranking",
        type=int,
        nargs="*",
        default=[],
        help="C for the full-ranking comparison (top_n = C: halving against the exhaustive "
        "tournament, lad_lab/eval/rerank_ranking.py)",
    )
    add("--ranking-methods", nargs="+", default=["agd"], help="full-ranking part: methods")
    add(
        "--item-seeds",
        type=int,
        nargs="*",
        default=[],
        help="full-ranking part: item seeds pooled, --items each (default: --eval-seed)",
    )
    add("--items", type=int, default=100)
    add("--orderings", type=int, default=4, help="multi-N part: balanced orderings per item")
    add("--calibration", type=int, default=5, help="M calibration examples")
    add("--eval-seed", type=int, default=3003)
    add("--calibration-seed", type=int, default=2002)
    add("--tournament-seed", type=int, default=0, help="item i plays seed + i")
    add("--bootstrap", type=int, default=BOOTSTRAP_SAMPLES)
    add("--batch-size", type=int, default=16)
    add("--threads", type=int, default=1)
    add("--out", type=Path, default=Path("runs/eval-rerank"))
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from app.models.loader import load_runner
    from lad_lab.eval.datasets.synthetic import image_size_for

    started = time.perf_counter()
    runner = load_runner(args.model, threads=args.threads)
    dataset = open_dataset("synthetic", image_size=image_size_for(runner))
    config = MethodConfig()
    metrics: dict[str, Any] = {
        "command": "lad eval rerank " + shlex.join(argv),
        "model": args.model,
        "eval_seed": args.eval_seed,
        "calibration_seed": args.calibration_seed,
        "tournament_seed": args.tournament_seed,
        "bootstrap": args.bootstrap,
    }
    if args.candidates:
        metrics["rerank"] = rerank_part(runner, dataset, args, config)
    if args.multi_n:
        metrics["multi_n"] = multi_n_part(runner, dataset, args, config)
    if args.ranking:
        from lad_lab.eval.rerank_ranking import ranking_part

        metrics["ranking"] = ranking_part(runner, dataset, args, config)
    metrics["wall_s"] = round(time.perf_counter() - started, 1)
    metrics["load"] = (
        " ".join(Path("/proc/loadavg").read_text().split()[:3])
        if Path("/proc/loadavg").exists()
        else "unknown"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    (args.out / "report.md").write_text(render(metrics))
    print(render(metrics))
    return 0
