"""Evaluation core (DESIGN §2.7): orderings, Acc, RStd, Cons, confusion, tables."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.eval import metrics, protocol, report

# Hand-computed example: I = 2 items, T = 2 orderings, N = 3.
ORDERINGS = np.array([[[0, 1, 2], [2, 0, 1]], [[0, 1, 2], [1, 2, 0]]])
TARGETS = np.array([0, 2])
GT = np.array(
    [[0, 1], [2, 1]]
)  # image 0 sits at position 1 of [2, 0, 1]; image 2 at 1 of [1, 2, 0]
PRED = np.array([[0, 0], [2, 1]])  # item 0 under ordering 1 picks position 0 = image 2 (wrong)


def test_make_orderings_identity_first_and_distinct() -> None:
    perms = protocol.make_orderings(4, 5, rng=np.random.default_rng(0))
    assert perms.shape == (5, 4)
    assert perms[0].tolist() == [0, 1, 2, 3]
    assert len({tuple(p) for p in perms.tolist()}) == 5
    for p in perms:
        assert sorted(p.tolist()) == [0, 1, 2, 3]


def test_make_orderings_with_fewer_permutations_than_t() -> None:
    perms = protocol.make_orderings(2, 5, rng=np.random.default_rng(0)).tolist()
    assert perms == [[0, 1], [1, 0], [0, 1], [1, 0], [0, 1]]
    assert protocol.make_orderings(1, 5, rng=np.random.default_rng(0)).tolist() == [[0]] * 5


def test_item_orderings_are_seeded_per_item() -> None:
    a = protocol.item_orderings(8, 10, seed=3)
    b = protocol.item_orderings(8, 4, seed=3, start=6)
    assert a.shape == (10, 5, 8)
    np.testing.assert_array_equal(a[6:], b)
    assert not np.array_equal(a, protocol.item_orderings(8, 10, seed=4))
    assert len({tuple(p) for p in a[:, 1].tolist()}) > 1  # items get different permutations


def test_apply_ordering_and_positions() -> None:
    images = ["x", "y", "z"]
    assert protocol.apply_ordering(images, [2, 0, 1]) == ["z", "x", "y"]
    with pytest.raises(ValueError):
        protocol.apply_ordering(images, [0, 0, 1])
    np.testing.assert_array_equal(protocol.gt_positions(TARGETS, ORDERINGS), GT)
    np.testing.assert_array_equal(protocol.chosen_images(PRED, ORDERINGS), [[0, 2], [2, 2]])
    # the position of the GT under the shown list holds the GT image
    for i in range(2):
        for t in range(2):
            shown = protocol.apply_ordering([0, 1, 2], ORDERINGS[i, t])
            assert shown[GT[i, t]] == TARGETS[i]


def test_hand_computed_metrics() -> None:
    np.testing.assert_allclose(metrics.accuracy_per_ordering(PRED, GT), [100.0, 50.0])
    recall = metrics.recall_per_position(PRED, GT, 3)
    np.testing.assert_allclose(recall, [100.0, 50.0, 100.0])
    assert metrics.recall_std(recall) == pytest.approx(math.sqrt(2500 / 3))  # 28.87
    assert metrics.consistency(protocol.chosen_images(PRED, ORDERINGS)) == 50.0
    np.testing.assert_allclose(
        metrics.confusion_matrix(PRED, GT, 3),
        [[100.0, 0.0, 0.0], [50.0, 50.0, 0.0], [0.0, 0.0, 100.0]],
    )


def test_evaluate_predictions_collects_everything() -> None:
    result = metrics.evaluate_predictions("vanilla", PRED, TARGETS, ORDERINGS)
    assert result.n == 3 and result.n_items == 2 and result.n_orderings == 2
    assert result.accuracy_mean == pytest.approx(75.0)
    assert result.accuracy_std == pytest.approx(math.sqrt(1250))  # std of [100, 50], n-1
    assert result.rstd == pytest.approx(math.sqrt(2500 / 3))
    assert result.consistency == 50.0
    assert result.recall_per_position == [100.0, 50.0, 100.0]
    d = result.to_dict()
    assert d["method"] == "vanilla" and d["confusion"][1] == [50.0, 50.0, 0.0]


def test_position_missing_from_gt_is_nan_and_ignored() -> None:
    gt = np.array([[0, 0], [1, 1]])
    pred = np.array([[0, 1], [1, 1]])
    recall = metrics.recall_per_position(pred, gt, 3)
    assert recall[:2].tolist() == [50.0, 100.0] and np.isnan(recall[2])
    assert metrics.recall_std(recall) == pytest.approx(np.std([50.0, 100.0], ddof=1))
    assert metrics.confusion_matrix(pred, gt, 3)[2].tolist() == [0.0, 0.0, 0.0]


def test_position_blind_oracle_and_first_position_picker() -> None:
    """An oracle is perfect and consistent; always answering "1" is biased and inconsistent."""
    n, items = 4, 200
    orderings = protocol.item_orderings(n, items, seed=1)
    targets = np.random.default_rng(2).integers(n, size=items)
    gt = protocol.gt_positions(targets, orderings)
    oracle = metrics.evaluate_predictions("oracle", gt, targets, orderings)
    assert oracle.accuracy_mean == 100.0 and oracle.rstd == 0.0 and oracle.consistency == 100.0
    first = metrics.evaluate_predictions("first", np.zeros_like(gt), targets, orderings)
    assert first.recall_per_position == [100.0, 0.0, 0.0, 0.0]
    assert first.rstd == pytest.approx(50.0)  # std of [100, 0, 0, 0], n-1
    assert 15.0 < first.accuracy_mean < 35.0
    assert first.consistency < 10.0  # the same image rarely comes first in all 5 orderings
    np.testing.assert_allclose(np.asarray(first.confusion)[:, 0], 100.0)


def test_shape_errors() -> None:
    with pytest.raises(ValueError):
        metrics.accuracy_per_ordering(PRED, GT[:1])
    with pytest.raises(ValueError):
        protocol.chosen_images(np.array([[0, 3], [0, 0]]), ORDERINGS)
    with pytest.raises(ValueError):
        protocol.gt_positions(TARGETS, np.array([[[0, 0, 1]] * 2] * 2))


def test_tables() -> None:
    result = metrics.evaluate_predictions("vanilla", PRED, TARGETS, ORDERINGS)
    other = metrics.evaluate_predictions("agd", GT, TARGETS, ORDERINGS)
    md = report.results_table([result, other]).splitlines()
    assert len(md) == 4 and md[0].startswith("| method")
    assert "75.0 ± 35.4" in md[2] and "28.9" in md[2] and "50.0" in md[2]
    assert "100.0 ± 0.0" in md[3]
    text = report.results_table([result], fmt="text")
    assert "|" not in text and "vanilla" in text
    confusion = report.confusion_table(result).splitlines()
    assert len(confusion) == 2 + 3 and "50.0" in confusion[3]
    with pytest.raises(ValueError):
        report.results_table([result], fmt="html")
