"""The position-drift alert thresholds against sampling noise (numbers, not a feeling).

Under no drift, the total variation (TV) between a live share of k answers and its
reference is noise: for raw answers the reference is itself a sample, the argmax of
M examples x N rotations at calibration; for debiased answers it is exactly uniform.
Each threshold of alerts.yml must keep false alarms rare at its minimum answer count
for M = 5 (the recommended calibration) and still catch a real shift. Simulated with a
fixed seed: multinomial draws, 4000 replicates per case. For N = 2 the raw check uses
M = 10: with M = 5 the calibration has only 10 passes and about 1 % of N = 2 profiles
would alarm on noise (deploy/README.md says to calibrate N = 2 with 10 examples).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.deploy.conftest import PROMETHEUS, load_yaml

ALERTS = {
    r["alert"]: r["expr"]
    for g in load_yaml(PROMETHEUS / "alerts.yml")["groups"]
    for r in g["rules"]
    if "alert" in r
}
REPS = 4000
M = 5


def threshold_and_min_answers(alert: str) -> tuple[float, int]:
    expr = ALERTS[alert]
    threshold = float(re.search(r"lad:position_drift:1h\{[^}]*\} > ([0-9.]+)", expr).group(1))
    answers = int(re.search(r"increase1h\{[^}]*\} >= (\d+)", expr).group(1))
    return threshold, answers


def shares(p: np.ndarray, draws: int, rng: np.random.Generator) -> np.ndarray:
    return rng.multinomial(draws, p, size=REPS) / draws


def tv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return 0.5 * np.abs(a - b).sum(axis=-1)


def heavy(n: int, first: float, at: int = 0) -> np.ndarray:
    p = np.full(n, (1 - first) / (n - 1))
    p[at] = first
    return p


def bias_shapes(n: int) -> list[np.ndarray]:
    decay = np.exp(-np.arange(n) / 2.0)
    return [np.full(n, 1 / n), decay / decay.sum(), heavy(n, 0.6), heavy(n, 0.9)]


@pytest.mark.parametrize(("n", "m"), [(2, 10), *((n, M) for n in range(3, 13))])
def test_raw_drift_threshold_false_alarms_under_one_percent(n: int, m: int) -> None:
    threshold, k = threshold_and_min_answers("LadRawPositionDrift")
    rng = np.random.default_rng(n)
    for p in bias_shapes(n):
        noise = tv(shares(p, k, rng), shares(p, m * n, rng))
        assert (noise > threshold).mean() < 0.01, (n, p.round(3))


@pytest.mark.parametrize("n", range(3, 13))
def test_raw_drift_threshold_catches_bias_moving_to_the_other_end(n: int) -> None:
    threshold, k = threshold_and_min_answers("LadRawPositionDrift")
    rng = np.random.default_rng(100 + n)
    calibrated, live = heavy(n, 0.8, at=0), heavy(n, 0.8, at=n - 1)
    detected = tv(shares(live, k, rng), shares(calibrated, M * n, rng)) > threshold
    assert detected.mean() > 0.95, n


@pytest.mark.parametrize("n", range(2, 13))
def test_debiased_drift_threshold_is_quiet_on_uniform_and_catches_a_favourite(n: int) -> None:
    threshold, k = threshold_and_min_answers("LadDebiasedPositionDrift")
    rng = np.random.default_rng(200 + n)
    uniform = np.full(n, 1 / n)
    assert (tv(shares(uniform, k, rng), uniform) > threshold).mean() < 0.001, n
    favourite = heavy(n, 1 / n + 0.25)  # one position wins 25 points more often
    assert (tv(shares(favourite, k, rng), uniform) > threshold).mean() > 0.95, n
