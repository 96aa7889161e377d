"""The one calibration build (DESIGN §2.3): rotated instances, then B and P from evidence."""

from __future__ import annotations

import numpy as np
import pytest

from app.method import debias
from app.method.calibrate import calibration_instances, estimate_calibration


def test_every_gt_visits_every_position_once() -> None:
    examples = [("q0", ["a", "b", "c", "d"], 2), ("q1", ["e", "f", "g", "h"], 0)]
    instances, gt = calibration_instances(examples)
    assert len(instances) == 8 and gt.tolist() == [2, 1, 0, 3, 0, 3, 2, 1]
    for (query, images), t in zip(instances, gt, strict=True):
        source = examples[0] if query == "q0" else examples[1]
        assert images[t] == source[1][source[2]]  # the GT image sits at its GT position
    assert sorted(gt[:4]) == sorted(gt[4:]) == [0, 1, 2, 3]


def test_estimate_is_the_bias_matrix_and_the_prior() -> None:
    rng = np.random.default_rng(1)
    _, gt = calibration_instances([("q", list(range(3)), 1)] * 5)
    scores = rng.normal(size=(len(gt), 3))
    attention = rng.random(size=(len(gt), 2, 3))
    cal = estimate_calibration(scores, attention, gt)
    np.testing.assert_allclose(cal.bias_matrix, debias.estimate_bias_matrix(scores, gt))
    np.testing.assert_allclose(cal.attention_prior, attention.mean(axis=0))
    assert cal.n == 3


def test_a_position_without_gt_is_refused() -> None:
    with pytest.raises(ValueError, match="no calibration instance"):
        estimate_calibration(np.zeros((2, 3)), np.ones((2, 1, 3)), np.array([0, 1]))


def test_raw_position_share_counts_the_argmax_of_every_instance() -> None:
    from app.method.calibrate import raw_position_share

    scores = np.array([[0.0, 1.0, -1.0], [2.0, 0.0, 0.0], [0.0, 3.0, 1.0], [0.1, 0.2, 0.0]])
    np.testing.assert_allclose(raw_position_share(scores), [0.25, 0.75, 0.0])
    with pytest.raises(ValueError):
        raw_position_share(np.zeros((0, 3)))
