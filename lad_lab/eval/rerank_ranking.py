"""``lad eval rerank --ranking C``: a full ranking of C documents (top_n = C, what the
rerankers library always asks) as the service now plays it, against today's exhaustive
tournament on the same items, windows and evidence (design §2.10).

Three tournaments per item, all from the same seed (so the same first-round windows and,
where windows coincide, the same cached forwards; the pass counts are what the service
spends, never discounted):

* ``exhaustive``: the runners-up rule at top_n = C, what ``/v1/rerank`` ran for a full
  ranking until now (one candidate out per window per round): the reference;
* ``halving``: successive halving at top_n = C, what it runs now (``choose_rule``);
* ``top-1``: winners only (top_n unset), the cheapest ranking, for scale.

Per item: NDCG@10 with the GT as the one relevant document; NDCG@10 graded by how many of
the query's five attributes a document shows (gain 2^a − 1, so the GT's 31 and a near
miss's 15 count); top-1 (the GT first); Kendall's tau of the whole ranking against the
exhaustive one; forward passes. Means with 95 % item-bootstrap CIs over every item of
every item seed pooled, paired differences against ``exhaustive`` on the same items, and
each seed's own mean.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from app.method.methods import MethodConfig
from lad_lab.demo import world
from lad_lab.eval.datasets import EvalItem, open_image
from lad_lab.eval.rerank_play import calibrated, paired, play, with_ci
from lad_lab.eval.stats import bootstrap_indices, mean_ci

SCHEMES: dict[str, tuple[str, bool]] = {
    "exhaustive": ("runners_up", True),
    "halving": ("halving", True),
    "top-1": ("runners_up", False),
}
"""Name -> (the tournament's rule, whether top_n = C (else 1))."""
REFERENCE = "exhaustive"
METRICS: tuple[str, ...] = ("ndcg10", "ndcg10_graded", "top1", "tau", "forward_passes")
CUTOFF = 10


def ndcg_at(ranking: list[int], gains: np.ndarray, k: int = CUTOFF) -> float:
    """NDCG@k of a ranking (candidate indices, best first) under per-candidate gains."""
    discount = 1.0 / np.log2(np.arange(2, k + 2))
    top = np.asarray(ranking[:k])
    dcg = float((gains[top] * discount[: top.size]).sum())
    ideal = np.sort(gains)[::-1][:k]
    best = float((ideal * discount[: ideal.size]).sum())
    return dcg / best if best > 0 else 0.0


def kendall_tau(a: list[int], b: list[int]) -> float:
    """Kendall's tau between two rankings of the same candidates (no ties: tau-a = tau-b)."""
    n = len(a)
    if n < 2:
        return 1.0
    pa, pb = np.empty(n), np.empty(n)
    pa[np.asarray(a)] = np.arange(n)
    pb[np.asarray(b)] = np.arange(n)
    sa = np.sign(pa[:, None] - pa[None, :])
    sb = np.sign(pb[:, None] - pb[None, :])
    return float((sa * sb).sum() / (n * (n - 1)))


def attribute_gains(item: EvalItem, candidates: int, image_size: int) -> np.ndarray:
    """2^a − 1 per candidate, a the query's attributes it shows (the GT: all five)."""
    _, seed, index = item.id.split("/")
    example = world.make_item(int(index), candidates, "random", int(seed), image_size)
    if example.target != item.answer:
        raise ValueError(f"{item.id}: not the demo world's item")
    target = example.attributes[example.target]
    shared = [sum(a[k] == v for k, v in target.items()) for a in example.attributes]
    return np.exp2(np.asarray(shared, dtype=float)) - 1.0


def ranking_part(
    runner: Any, dataset: Any, args: argparse.Namespace, config: MethodConfig
) -> list[dict[str, Any]]:
    """Every C of ``args.ranking``: the schemes of ``SCHEMES`` per method, pooled over
    ``args.item_seeds``."""
    evidence, calibrations, calibration_keys = calibrated(runner, dataset, args)
    results = []
    seeds = args.item_seeds or [args.eval_seed]
    for c in args.ranking:
        items = [
            (seed, item)
            for seed in seeds
            for item in dataset.items(args.items, c, "random", seed, exclude=calibration_keys)
        ]
        per: dict[str, dict[str, dict[str, np.ndarray]]] = {
            m: {s: {k: np.zeros(len(items)) for k in METRICS} for s in SCHEMES}
            for m in args.ranking_methods
        }
        for g, (_, item) in enumerate(items):
            images = [open_image(im) for im in item.images]
            binary = np.zeros(c)
            binary[item.answer] = 1.0
            graded = attribute_gains(item, c, dataset.image_size)
            for m in args.ranking_methods:
                rankings = {}
                for name, (rule, full) in SCHEMES.items():
                    ranking, spent = play(
                        evidence,
                        item,
                        images,
                        m,
                        args.window,
                        calibrations,
                        config,
                        seed=args.tournament_seed + g,
                        top_n=c if full else 1,
                        rule=rule,
                    )
                    rankings[name] = ranking
                    row = per[m][name]
                    row["ndcg10"][g] = ndcg_at(ranking, binary)
                    row["ndcg10_graded"][g] = ndcg_at(ranking, graded)
                    row["top1"][g] = 100.0 * (ranking[0] == item.answer)
                    row["forward_passes"][g] = spent
                for name, ranking in rankings.items():
                    per[m][name]["tau"][g] = kendall_tau(ranking, rankings[REFERENCE])
            print(f"ranking C={c}: item {g + 1}/{len(items)}", file=sys.stderr, end="\r")
        indices = bootstrap_indices(len(items), args.bootstrap)
        item_seeds = np.asarray([seed for seed, _ in items])
        results.append(
            {
                "candidates": c,
                "window": args.window,
                "items": len(items),
                "item_seeds": seeds,
                "methods": {
                    m: _summaries(per[m], indices, item_seeds) for m in args.ranking_methods
                },
            }
        )
    return results


def _summaries(
    per: dict[str, dict[str, np.ndarray]], indices: np.ndarray, item_seeds: np.ndarray
) -> dict[str, Any]:
    out: dict[str, Any] = {"schemes": {}, "paired": {}}
    for name, row in per.items():
        out["schemes"][name] = {
            k: {
                "mean": float(v.mean()),
                "ci": mean_ci(v, indices),
                "per_seed": {
                    str(s): float(v[item_seeds == s].mean()) for s in np.unique(item_seeds)
                },
            }
            for k, v in row.items()
        }
    for name, row in per.items():
        if name == REFERENCE:
            continue
        out["paired"][f"{name} - {REFERENCE}"] = {
            k: paired(row[k], per[REFERENCE][k], indices)
            for k in ("ndcg10", "ndcg10_graded", "top1")
        }
    return out


def _spread(x: dict[str, Any], digits: int) -> str:
    values = list(x["per_seed"].values())
    return f"{min(values):.{digits}f} to {max(values):.{digits}f}"


def render(results: list[dict[str, Any]]) -> list[str]:
    """The report's section of the full-ranking part."""
    lines: list[str] = []
    for r in results:
        for method, summary in r["methods"].items():
            schemes = summary["schemes"]
            lines += [
                f"## Full ranking of {r['candidates']} documents, window {r['window']}, "
                f"{method} ({r['items']} items: item seeds {', '.join(map(str, r['item_seeds']))})",
                "",
                "Per item, three tournaments from one seed (the same first round): "
                "`exhaustive` (top_n = C, runners-up advance: the service's full ranking "
                "before), `halving` (top_n = C as the service plays it now), `top-1` (top_n "
                "unset). NDCG@10 (GT): the GT the one relevant document; NDCG@10 (graded): "
                "gain 2^a − 1 for a document showing a of the query's five attributes; Kendall "
                "tau of the whole ranking against the exhaustive one. The item seeds stand in "
                "for the eval seed here.",
                "",
                "| tournament | forward passes / item | NDCG@10 (GT) | NDCG@10 (graded) | "
                "top-1 (%) | Kendall tau vs exhaustive |",
                "|:--|--:|--:|--:|--:|--:|",
            ]
            for name, s in schemes.items():
                cells = [with_ci(s[k], 1 if k == "top1" else 3) for k in METRICS[:-1]]
                lines.append(
                    f"| {name} | {s['forward_passes']['mean']:.1f} | {' | '.join(cells)} |"
                )
            lines += [
                "",
                "| paired (same items) | metric | Δ | 95% CI | verdict |",
                "|:--|:--|--:|--:|--:|",
            ]
            for pair, table in summary["paired"].items():
                for metric, d in table.items():
                    digits = 1 if metric == "top1" else 3
                    lines.append(
                        f"| {pair} | {metric} | {d['mean']:+.{digits}f} | "
                        f"[{d['ci'][0]:+.{digits}f}, {d['ci'][1]:+.{digits}f}] | {d['verdict']} |"
                    )
            lines += [
                "",
                "Per item seed (min to max of the seeds' means): "
                + "; ".join(
                    f"{name} NDCG@10 {_spread(s['ndcg10'], 3)}, graded "
                    f"{_spread(s['ndcg10_graded'], 3)}"
                    for name, s in schemes.items()
                )
                + ".",
                "",
            ]
    return lines
