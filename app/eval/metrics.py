"""Metrics of the evaluation protocol (DESIGN §2.7): Acc, RStd, Cons and the confusion matrix.

Inputs are plain arrays over I items and T orderings (see ``app.eval.protocol`` for the
ordering convention): predicted positions (I, T), GT positions (I, T), and for Cons the
orderings (I, T, N). Every rate is in percent.

- Acc: accuracy of each ordering slot over the items; reported as mean ± sample std
  (n-1) over the T slots (slot 0 is the identity ordering of every item).
- RStd: sample std (n-1) across the N positions of the recall per GT position, the
  recall pooled over all (item, ordering) instances; in percentage points.
- Cons: % of items whose chosen *image* is the same under all T orderings.
- Confusion: rows = GT position, columns = predicted position, each row the selection
  rate in % (sums to 100 where the row has instances).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from app.eval.protocol import chosen_images, gt_positions


def _pair(predicted: Any, gt: Any) -> tuple[np.ndarray, np.ndarray]:
    pred = np.asarray(predicted, dtype=np.int64)
    g = np.asarray(gt, dtype=np.int64)
    if pred.shape != g.shape or pred.ndim != 2:
        raise ValueError(
            f"predictions and GT positions must both be (I, T), got {pred.shape}, {g.shape}"
        )
    return pred, g


def _sample_std(x: np.ndarray) -> float:
    """Sample std (n-1); 0 for a single value (no spread can be observed)."""
    return float(np.std(x, ddof=1)) if x.size > 1 else 0.0


def accuracy_per_ordering(predicted: Any, gt: Any) -> np.ndarray:
    """(T,) accuracy in % of each ordering slot over the I items."""
    pred, g = _pair(predicted, gt)
    return 100.0 * (pred == g).mean(axis=0)


def recall_per_position(predicted: Any, gt: Any, n: int) -> np.ndarray:
    """(N,) recall in % of the instances whose GT is at each position, pooled over orderings.

    NaN for a position that never holds the GT.
    """
    pred, g = _pair(predicted, gt)
    hits = np.bincount(g[pred == g], minlength=n).astype(float)
    totals = np.bincount(g.ravel(), minlength=n).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(totals > 0, 100.0 * hits / np.maximum(totals, 1), np.nan)


def recall_std(recall: Any) -> float:
    """RStd: sample std (n-1) of the per-position recall, ignoring positions without GT."""
    r = np.asarray(recall, dtype=float)
    return _sample_std(r[~np.isnan(r)])


def consistency(chosen: Any) -> float:
    """Cons: % of items (rows of ``chosen``, (I, T) image indices) with one image under all T."""
    c = np.asarray(chosen)
    if c.ndim != 2 or c.shape[0] == 0:
        raise ValueError(f"chosen images must be (I, T) with I >= 1, got {c.shape}")
    return float(100.0 * np.mean(np.all(c == c[:, :1], axis=1)))


def confusion_matrix(predicted: Any, gt: Any, n: int) -> np.ndarray:
    """(N, N) selection rate in %: row t = GT position, column j = predicted position."""
    pred, g = _pair(predicted, gt)
    counts = np.zeros((n, n))
    np.add.at(counts, (g.ravel(), pred.ravel()), 1.0)
    totals = counts.sum(axis=1, keepdims=True)
    return np.divide(100.0 * counts, totals, out=np.zeros_like(counts), where=totals > 0)


@dataclass
class MethodResult:
    """The metrics of one method on one evaluation run (rates in %)."""

    method: str
    n: int
    n_items: int
    n_orderings: int
    accuracy_per_ordering: list[float]
    accuracy_mean: float
    accuracy_std: float
    rstd: float
    consistency: float
    recall_per_position: list[float | None]
    confusion: list[list[float]]
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (NaN recall becomes None)."""
        return asdict(self)


def evaluate_predictions(method: str, predicted: Any, targets: Any, orderings: Any) -> MethodResult:
    """All metrics of one method from its predicted positions (I, T).

    targets: (I,) GT image index in each item's original order; orderings: (I, T, N).
    """
    perms = np.asarray(orderings)
    n = perms.shape[-1]
    gt = gt_positions(targets, perms)
    pred, gt = _pair(predicted, gt)
    acc = accuracy_per_ordering(pred, gt)
    recall = recall_per_position(pred, gt, n)
    return MethodResult(
        method=method,
        n=n,
        n_items=int(pred.shape[0]),
        n_orderings=int(pred.shape[1]),
        accuracy_per_ordering=[float(x) for x in acc],
        accuracy_mean=float(acc.mean()),
        accuracy_std=_sample_std(acc),
        rstd=recall_std(recall),
        consistency=consistency(chosen_images(pred, perms)),
        recall_per_position=[None if np.isnan(x) else float(x) for x in recall],
        confusion=confusion_matrix(pred, gt, n).tolist(),
    )
