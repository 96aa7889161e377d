"""metrics.json from the prediction records, and nothing else (DESIGN §2.7 and the honest
statistics beside it).

``compute_metrics(records, calibrations)`` is the one code path: the harness writes
predictions.jsonl and calls it on the same records, so anyone can recompute metrics.json
from predictions.jsonl (plus calibration.json for the calibration block). A record is one
(item, ordering, method, n, setting): ``gt_position``, ``predicted_position`` (None:
a generated answer that could not be parsed), ``correct``, ``order``, ``probabilities``,
``forward_passes``, ``latency_ms`` (see ``lad_lab.eval.records``). Rates are in %.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from lad_lab.eval import stats
from lad_lab.eval.diagnostics import calibration_block, diagnostics
from lad_lab.eval.records import Group, run_key

PAIRS: tuple[tuple[str, str], ...] = (
    ("agd", "vanilla"),
    ("agd", "attn_pure"),
    ("agd", "perm_avg"),
    ("agd", "pride"),
    ("attn_pure", "attn_raw"),
    ("attn_pure", "vanilla"),
    ("perm_avg", "vanilla"),
    ("instruction", "vanilla"),
    ("cot", "vanilla"),
    ("self_consistency", "vanilla"),
)
"""Paired differences reported when both methods ran (a − b, same items and orderings)."""

RECALL_AT = (1, 2, 3, 5)


def _per_position(a: dict[str, np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per item: hits (I, N) and GT counts (I, N) by GT position."""
    gt, correct = a["gt"], a["correct"]
    onehot = np.eye(n, dtype=float)[gt]  # (I, T, N)
    return (onehot * correct[..., None]).sum(axis=1), onehot.sum(axis=1)


def _ranks(prob: np.ndarray, gt: np.ndarray) -> np.ndarray:
    """Mid-rank of the GT in each probability vector (ties with others count half)."""
    p_gt = np.take_along_axis(prob, gt[..., None], axis=-1)
    greater = (prob > p_gt).sum(axis=-1)
    ties = (prob == p_gt).sum(axis=-1) - 1
    return 1.0 + greater + ties / 2.0


def _nullable(values: Iterable[float]) -> list[float | None]:
    return [None if np.isnan(v) else float(v) for v in values]


def method_metrics(
    a: dict[str, np.ndarray], n: int, indices: np.ndarray, seed: int
) -> dict[str, Any]:
    """Every per-method figure of metrics.json from one method's arrays."""
    correct = a["correct"].astype(float)
    hits, totals = _per_position(a, n)
    with np.errstate(invalid="ignore", divide="ignore"):
        recall = 100.0 * hits.sum(0) / totals.sum(0)
    kept = recall[~np.isnan(recall)]
    acc = 100.0 * correct.mean()
    pred = a["pred"]
    selection = 100.0 * np.array([(pred == j).mean() for j in range(n)])
    confusion = np.zeros((n, n))
    parsed = pred >= 0
    np.add.at(confusion, (a["gt"][parsed], pred[parsed]), 1.0)
    row = np.bincount(a["gt"].ravel(), minlength=n)[:, None]
    ranks = _ranks(a["prob"], a["gt"])
    image = a["image"]
    consistent = np.all(image == image[:, :1], axis=1) & np.all(image >= 0, axis=1)
    out: dict[str, Any] = {
        "acc": float(acc),
        "acc_ci": stats.mean_ci(100.0 * correct.mean(axis=1), indices),
        "acc_ci_degenerate": bool(np.ptp(correct.mean(axis=1)) == 0),
        "acc_by_ordering": (100.0 * correct.mean(axis=0)).tolist(),
        "rstd": float(np.std(kept, ddof=1)) if kept.size > 1 else 0.0,
        "rstd_ci": stats.percentile_ci(stats.recall_std_replicates(hits, totals, indices)),
        "rstd_noise_floor": stats.rstd_noise_floor(acc, totals.sum(0), seed=seed),
        "cons": float(100.0 * consistent.mean()),
        "recall_by_position": _nullable(recall),
        "recall_ci": stats.recall_cis(hits, totals, indices),
        "selection_by_position": selection.tolist(),
        "confusion": np.divide(
            100.0 * confusion, row, out=np.zeros_like(confusion), where=row > 0
        ).tolist(),
        "mrr": float(np.mean(1.0 / ranks)),
        "recall_at_k": {str(k): float(100.0 * np.mean(ranks <= k)) for k in RECALL_AT if k <= n},
        "forward_passes_per_item": float(a["passes"].mean()),
        "latency_ms_per_item": float(a["ms"].mean()),
        "generation_based": bool(a["generation"]),
    }
    if out["generation_based"]:
        out["unparseable_pct"] = float(100.0 * a["unparseable"].sum() / a["samples"].sum())
        out["no_answer_pct"] = float(100.0 * (pred < 0).mean())
    return out


def paired_metrics(
    x: dict[str, np.ndarray], y: dict[str, np.ndarray], indices: np.ndarray
) -> dict[str, Any]:
    """a − b in accuracy points on the same items, with its paired item-bootstrap CI."""
    a, b = x["correct"], y["correct"]
    per_item = 100.0 * (a.astype(float) - b.astype(float)).mean(axis=1)
    ci = stats.mean_ci(per_item, indices)
    return {
        "diff": float(per_item.mean()),
        "ci": ci,
        "rescues": int((a & ~b).sum()),
        "harms": int((~a & b).sum()),
        "inside_noise": bool(ci[0] <= 0.0 <= ci[1]),
        "ci_degenerate": bool(np.ptp(per_item) == 0),
    }


def group_metrics(
    group: Group, calibration: Mapping[str, Any] | None, samples: int, seed: int
) -> dict[str, Any]:
    """One (n, setting) block of metrics.json."""
    indices = stats.bootstrap_indices(len(group.items), samples, seed)
    methods = {m: method_metrics(group.by_method[m], group.n, indices, seed) for m in group.methods}
    paired = {
        f"{a}-{b}": paired_metrics(group.by_method[a], group.by_method[b], indices)
        for a, b in PAIRS
        if a in group.by_method and b in group.by_method
    }
    return {
        "n": group.n,
        "setting": group.setting,
        "items": len(group.items),
        "orderings": len(group.orderings),
        "position_counts": group.position_counts(),
        "methods": methods,
        "paired": paired,
        "diagnostics": diagnostics(group, calibration),
        "calibration": None if calibration is None else calibration_block(calibration),
    }


def compute_metrics(
    records: Sequence[Mapping[str, Any]],
    calibrations: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    samples: int = stats.BOOTSTRAP_SAMPLES,
    seed: int = stats.BOOTSTRAP_SEED,
) -> dict[str, Any]:
    """metrics.json: one block per (n, setting) in order of appearance.

    ``calibrations``: calibration.json's ``runs`` keyed by ``run_key(n, setting)``.
    """
    keys = list(dict.fromkeys((int(r["n"]), str(r["setting"])) for r in records))
    runs = []
    for n, setting in keys:
        mine = [r for r in records if int(r["n"]) == n and r["setting"] == setting]
        calibration = (calibrations or {}).get(run_key(n, setting))
        runs.append(group_metrics(Group(n, setting, mine), calibration, samples, seed))
    return {
        "bootstrap": {"samples": samples, "seed": seed, "level": stats.LEVEL, "unit": "item"},
        "runs": runs,
    }
