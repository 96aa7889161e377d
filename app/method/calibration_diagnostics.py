"""What five examples can say about a calibration, from the evidence already in hand.

No extra forward pass: the M·N rotated instances' scores and attention are reused.

- Leave-one-example-out accuracy: each example's N instances answered with the
  calibration estimated from the other M − 1 examples, for vanilla, attn_pure and agd.
  It tells an operator whether debiasing helps this model on this data (agd above
  vanilla) before any traffic is served. Needs M >= 2.
- Bootstrap spread of B: examples resampled with replacement; the mean and largest
  standard deviation of B's entries say how sure the estimate is.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.method.calibrate import CalibrationStats, estimate_from_stats
from app.method.methods import MethodConfig, apply_method

DIAGNOSTIC_METHODS = ("vanilla", "attn_pure", "agd")


def accuracy_with(
    calibration: Any,
    scores: Any,
    attention: Any,
    answers: Any,
    config: MethodConfig,
    methods: tuple[str, ...] = DIAGNOSTIC_METHODS,
) -> dict[str, float]:
    """Accuracy per method of one calibration on instances (R, N), (R, |Λ|, N), (R,)."""
    s, a = np.asarray(scores, dtype=np.float64), np.asarray(attention, dtype=np.float64)
    t = np.asarray(answers, dtype=np.int64)
    out = {}
    for method in methods:
        probs = apply_method(method, s, a, calibration, config).probabilities
        out[method] = float(np.mean(np.argmax(probs, axis=-1) == t))
    return out


def calibration_diagnostics(
    scores: Any,
    attention: Any,
    gt_positions: Any,
    n: int,
    config: MethodConfig,
    *,
    bootstrap: int = 200,
    seed: int = 0,
) -> dict[str, Any]:
    """Diagnostics of a calibration from its rotated instances (example m = rows m·N..m·N+N-1)."""
    s = np.asarray(scores, dtype=np.float64)
    a = np.asarray(attention, dtype=np.float64)
    gt = np.asarray(gt_positions, dtype=np.int64)
    m = s.shape[0] // n
    per_example = [
        CalibrationStats.from_evidence(
            s[i * n : (i + 1) * n], a[i * n : (i + 1) * n], gt[i * n : (i + 1) * n]
        )
        for i in range(m)
    ]
    total = sum(per_example[1:], per_example[0])
    result: dict[str, Any] = {"num_examples": m, "instances": int(s.shape[0])}
    if m >= 2:
        correct = dict.fromkeys(DIAGNOSTIC_METHODS, 0.0)
        for i, own in enumerate(per_example):
            rest = estimate_from_stats(
                CalibrationStats(
                    total.row_sums - own.row_sums,
                    total.row_counts - own.row_counts,
                    total.prior_sums - own.prior_sums,
                    total.prior_count - own.prior_count,
                )
            )
            rows = slice(i * n, (i + 1) * n)
            for method, acc in accuracy_with(rest, s[rows], a[rows], gt[rows], config).items():
                correct[method] += acc * n
        result["loo_accuracy"] = {k: round(v / (m * n), 4) for k, v in correct.items()}
    else:
        result["loo_accuracy"] = None
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(bootstrap if m >= 2 else 0):
        pick = rng.integers(0, m, size=m)
        stats = sum((per_example[j] for j in pick[1:]), per_example[pick[0]])
        samples.append(estimate_from_stats(stats).bias_matrix)
    if samples:
        std = np.std(np.stack(samples), axis=0, ddof=1)
        result["bias_bootstrap_std"] = {
            "mean": round(float(std.mean()), 4),
            "max": round(float(std.max()), 4),
            "samples": len(samples),
        }
    else:
        result["bias_bootstrap_std"] = None
    return result
