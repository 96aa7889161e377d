"""The sums-and-counts form of the calibration (DESIGN §2.8), its blend, its diagnostics."""

from __future__ import annotations

import numpy as np
import pytest

from app.method.calibrate import (
    CalibrationStats,
    blend,
    estimate_calibration,
    estimate_from_stats,
)
from app.method.calibration_diagnostics import calibration_diagnostics
from app.method.methods import MethodConfig


def _evidence(rng, r: int, n: int = 3, layers: int = 2):
    return rng.normal(size=(r, n)), rng.random(size=(r, layers, n)), np.arange(r) % n


def test_sums_add_up_to_the_estimate_of_all_instances() -> None:
    rng = np.random.default_rng(0)
    s1, a1, g1 = _evidence(rng, 9)
    s2, a2, g2 = _evidence(rng, 6)
    parts = CalibrationStats.from_evidence(s1, a1, g1) + CalibrationStats.from_evidence(s2, a2, g2)
    whole = estimate_calibration(np.vstack([s1, s2]), np.vstack([a1, a2]), np.r_[g1, g2])
    np.testing.assert_allclose(estimate_from_stats(parts).bias_matrix, whole.bias_matrix)
    np.testing.assert_allclose(estimate_from_stats(parts).attention_prior, whole.attention_prior)
    again = CalibrationStats.from_dict(parts.to_dict())
    np.testing.assert_array_equal(again.row_sums, parts.row_sums)


def test_blend_is_count_weighted_and_keeps_thin_rows_offline() -> None:
    offline = CalibrationStats(np.zeros((3, 3)), np.full(3, 5), np.full((1, 3), 5.0), 15)
    rows = np.array([[30.0, 0, 0], [0, 4.0, 0], [0, 0, 0]])
    feedback = CalibrationStats(rows, np.array([15, 4, 0]), np.full((1, 3), 3.0), 19)
    mixed = blend(offline, feedback, min_row_count=10)
    lobs = mixed.observed_matrix()
    np.testing.assert_allclose(lobs[0], [30 / 20, 0, 0])  # (0 + 30) / (5 + 15)
    np.testing.assert_allclose(lobs[1], 0)  # 4 < 10 feedback: the offline row
    np.testing.assert_allclose(mixed.prior_sums / mixed.prior_count, 8 / 34)
    with pytest.raises(ValueError, match="shapes"):
        blend(offline, CalibrationStats.empty(4, 1), 1)


def test_diagnostics_reuse_the_evidence() -> None:
    rng = np.random.default_rng(1)
    n, m = 3, 5
    gt = np.tile(np.arange(n), m)
    scores = rng.normal(scale=0.1, size=(m * n, n))
    scores[:, 0] += 3.0  # the model always says "1": vanilla is right 1 time in 3
    attention = np.full((m * n, 2, n), 0.1)
    attention[np.arange(m * n), :, gt] = 0.8  # the attention finds the GT
    diag = calibration_diagnostics(scores, attention, gt, n, MethodConfig(), bootstrap=50)
    loo = diag["loo_accuracy"]
    assert loo["vanilla"] == pytest.approx(1 / 3, abs=1e-4) and loo["attn_pure"] == 1.0
    assert loo["agd"] > loo["vanilla"]
    assert diag["bias_bootstrap_std"]["samples"] == 50 and diag["bias_bootstrap_std"]["mean"] > 0
    one = calibration_diagnostics(scores[:n], attention[:n], gt[:n], n, MethodConfig())
    assert one["loo_accuracy"] is None and one["bias_bootstrap_std"] is None
