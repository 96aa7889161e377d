"""Honest statistics of the evaluation (DESIGN §2.7): item bootstrap, paired differences, the
RStd noise floor and ROC-AUC. Pure numpy, seeded, so every figure is recomputable.

The unit of resampling is the *item* (all its orderings go together): orderings of one
item share its difficulty, so resampling instances would understate the spread.
"""

from __future__ import annotations

from typing import Any

import numpy as np

BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 0
LEVEL = 0.95
NOISE_FLOOR_DRAWS = 4000


def bootstrap_indices(
    n_items: int, samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED
) -> np.ndarray:
    """(samples, n_items) item indices drawn with replacement; shared by every method of a run,
    so that paired differences resample the same items."""
    if n_items < 1:
        raise ValueError("the bootstrap needs at least one item")
    return np.random.default_rng(seed).integers(0, n_items, size=(samples, n_items))


def percentile_ci(values: Any, level: float = LEVEL) -> list[float]:
    """[lo, hi]: the central ``level`` interval of bootstrap replicates (percentile method)."""
    v = np.asarray(values, dtype=float)
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(v, [tail, 100.0 - tail])
    return [float(lo), float(hi)]


def mean_ci(per_item: Any, indices: np.ndarray, level: float = LEVEL) -> list[float]:
    """CI of the mean of a per-item quantity (I,) under the item bootstrap ``indices``."""
    x = np.asarray(per_item, dtype=float)
    return percentile_ci(x[indices].mean(axis=1), level)


def recall_cis(
    hits: Any, totals: Any, indices: np.ndarray, level: float = LEVEL
) -> list[list[float] | None]:
    """Item-bootstrap CI (%) of the recall at each GT position (None: never the GT there)."""
    h = np.asarray(hits, dtype=float)[indices].sum(axis=1)
    c = np.asarray(totals, dtype=float)[indices].sum(axis=1)
    out: list[list[float] | None] = []
    for j in range(h.shape[1]):
        seen = c[:, j] > 0
        out.append(percentile_ci(100.0 * h[seen, j] / c[seen, j], level) if seen.any() else None)
    return out


def recall_std_replicates(hits: Any, totals: Any, indices: np.ndarray) -> np.ndarray:
    """RStd (%) of each bootstrap replicate from per-item hits and GT counts per position (I, N)."""
    h = np.asarray(hits, dtype=float)[indices].sum(axis=1)
    c = np.asarray(totals, dtype=float)[indices].sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        recall = 100.0 * h / c
    out = np.empty(recall.shape[0])
    for b, row in enumerate(recall):
        kept = row[~np.isnan(row)]
        out[b] = float(np.std(kept, ddof=1)) if kept.size > 1 else 0.0
    return out


def rstd_noise_floor(
    accuracy: float, counts: Any, draws: int = NOISE_FLOOR_DRAWS, seed: int = BOOTSTRAP_SEED
) -> float:
    """The RStd (%) a position-independent method with this accuracy (%) shows at these GT
    counts per position: every instance correct with probability acc, independently,
    so the per-position recall is Binomial(n_t, acc) / n_t; the mean sample std (n-1)
    over ``draws`` seeded draws. An RStd within this is indistinguishable from no bias.
    """
    n_t = np.asarray(counts, dtype=np.int64)
    n_t = n_t[n_t > 0]
    if n_t.size < 2:
        return 0.0
    p = min(max(accuracy / 100.0, 0.0), 1.0)
    hits = np.random.default_rng(seed).binomial(n_t, p, size=(draws, n_t.size))
    return float(np.mean(np.std(100.0 * hits / n_t, axis=1, ddof=1)))


def average_ranks(x: Any) -> np.ndarray:
    """1-based ranks of ``x`` with ties sharing the average of their ranks."""
    v = np.asarray(x, dtype=float)
    order = np.argsort(v, kind="stable")
    ranks = np.empty(v.size)
    sorted_v = v[order]
    start = 0
    while start < v.size:
        stop = start
        while stop + 1 < v.size and sorted_v[stop + 1] == sorted_v[start]:
            stop += 1
        ranks[order[start : stop + 1]] = (start + stop) / 2.0 + 1.0
        start = stop + 1
    return ranks


def roc_auc(scores: Any, labels: Any) -> float | None:
    """ROC-AUC through the Mann–Whitney U statistic: P(score of a positive > score of a
    negative) + ½ P(tie). None when one class is empty (undefined)."""
    s = np.asarray(scores, dtype=float)
    y = np.asarray(labels, dtype=bool)
    if s.shape != y.shape or s.ndim != 1:
        raise ValueError(f"scores and labels must be 1-D of one length, got {s.shape}, {y.shape}")
    positives, negatives = int(y.sum()), int((~y).sum())
    if positives == 0 or negatives == 0:
        return None
    ranks = average_ranks(s)
    u = ranks[y].sum() - positives * (positives + 1) / 2.0
    return float(u / (positives * negatives))
