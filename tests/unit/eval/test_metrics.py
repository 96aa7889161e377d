"""The evaluation's pure parts: balanced orderings, the statistics, and metrics.json computed
from prediction records, checked against independent loop-by-loop recomputations."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from lad_lab.eval import protocol, stats
from lad_lab.eval.metrics import compute_metrics
from lad_lab.eval.records import make_record


def test_balanced_orderings_put_every_image_at_every_position_equally() -> None:
    assert protocol.balanced_count(4, 4) == 4
    assert protocol.balanced_count(4, 8) == 8
    assert protocol.balanced_count(5, 4) == 8
    orderings = protocol.item_orderings(5, 3, 10, seed=7)
    assert orderings.shape == (3, 10, 5)
    for item in orderings:
        for image in range(5):
            positions = np.argmax(item == image, axis=1)
            assert np.bincount(positions, minlength=5).tolist() == [2] * 5
        bases = {tuple(item[b * 5]) for b in range(2)}
        assert len(bases) == 2  # distinct base permutations
    np.testing.assert_array_equal(protocol.item_orderings(5, 2, 10, seed=7), orderings[:2])
    assert not np.array_equal(protocol.item_orderings(5, 3, 10, seed=8), orderings)
    with pytest.raises(ValueError, match="multiple"):
        protocol.balanced_orderings(4, 6, rng=np.random.default_rng(0))


def test_balanced_orderings_with_few_permutations() -> None:
    orderings = protocol.balanced_orderings(2, 6, rng=np.random.default_rng(0))
    assert sorted(map(tuple, orderings.tolist())) == [(0, 1)] * 3 + [(1, 0)] * 3


def test_gt_positions_and_apply_ordering() -> None:
    assert protocol.apply_ordering(["x", "y", "z"], [2, 0, 1]) == ["z", "x", "y"]
    with pytest.raises(ValueError):
        protocol.apply_ordering(["x", "y"], [0, 0])
    orderings = np.array([[[0, 1, 2], [2, 0, 1]], [[0, 1, 2], [1, 2, 0]]])
    np.testing.assert_array_equal(protocol.gt_positions([0, 2], orderings), [[0, 1], [2, 1]])


def _brute_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    pos, neg = scores[labels], scores[~labels]
    wins = sum((p > q) + 0.5 * (p == q) for p, q in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", range(5))
def test_roc_auc_is_the_pairwise_definition_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 4, size=40).astype(float)  # many ties
    labels = rng.random(40) < 0.3
    assert stats.roc_auc(scores, labels) == pytest.approx(_brute_auc(scores, labels))
    assert stats.roc_auc(scores, np.zeros(40, bool)) is None
    assert stats.roc_auc([1.0, 2.0, 3.0], [False, False, True]) == 1.0
    assert stats.roc_auc([3.0, 2.0, 1.0], [False, False, True]) == 0.0


def test_average_ranks() -> None:
    assert stats.average_ranks([10, 20, 20, 5]).tolist() == [2.0, 3.5, 3.5, 1.0]


def test_noise_floor_matches_the_binomial_spread() -> None:
    counts = [4000] * 4
    floor = stats.rstd_noise_floor(60.0, counts, seed=1)
    assert floor == pytest.approx(100 * math.sqrt(0.6 * 0.4 / 4000), rel=0.15)
    assert stats.rstd_noise_floor(60.0, [50] * 8) > stats.rstd_noise_floor(60.0, [800] * 8)
    assert stats.rstd_noise_floor(100.0, [50] * 4) == 0.0
    assert stats.rstd_noise_floor(50.0, [50]) == 0.0


def test_item_bootstrap_ci() -> None:
    per_item = np.r_[np.ones(50), np.zeros(50)] * 100
    idx = stats.bootstrap_indices(100, 2000, seed=3)
    lo, hi = stats.mean_ci(per_item, idx)
    assert lo < 50 < hi and hi - lo == pytest.approx(2 * 1.96 * 5, rel=0.2)  # ±1.96·SE
    np.testing.assert_array_equal(idx, stats.bootstrap_indices(100, 2000, seed=3))


# ------------------------------------------------------------------ metrics from records
N, ITEMS, T = 3, 12, 6


def _records(seed: int = 0) -> list[dict]:
    """vanilla biased to position 0, agd right ~70%, a generation method with None answers."""
    rng = np.random.default_rng(seed)
    orderings = protocol.item_orderings(N, ITEMS, T, seed=seed)
    targets = rng.integers(0, N, size=ITEMS)
    gt = protocol.gt_positions(targets, orderings)
    records = []
    for method in ("vanilla", "agd", "cot"):
        for i in range(ITEMS):
            for o in range(T):
                g = int(gt[i, o])
                if method == "vanilla":
                    pred = 0 if rng.random() < 0.7 else g
                elif method == "agd":
                    pred = g if rng.random() < 0.7 else int(rng.integers(N))
                else:
                    pred = None if rng.random() < 0.3 else int(rng.integers(N))
                p = rng.random(N)
                if pred is not None:
                    p[pred] = p.max() + 1
                p /= p.sum()
                gen = None if method != "cot" else {"answers": [pred], "text": "x"}
                records.append(
                    make_record(
                        item=f"it{i}",
                        n=N,
                        setting="random",
                        dataset="d",
                        ordering=o,
                        order=orderings[i, o],
                        method=method,
                        gt_position=g,
                        probabilities=p,
                        predicted_position=pred,
                        forward_passes=1,
                        latency_ms=2.0,
                        generation=gen,
                    )
                )
    return records


def test_metrics_recomputed_by_hand_from_records() -> None:
    records = _records()
    metrics = compute_metrics(records, samples=300, seed=0)
    (run,) = metrics["runs"]
    assert run["position_counts"] == [ITEMS * T // N] * N
    for method, m in run["methods"].items():
        mine = [r for r in records if r["method"] == method]
        assert m["acc"] == pytest.approx(100 * np.mean([r["correct"] for r in mine]))
        assert m["acc_ci"][0] <= m["acc"] <= m["acc_ci"][1]
        recall = []
        for t in range(N):
            at_t = [r for r in mine if r["gt_position"] == t]
            recall.append(100 * np.mean([r["correct"] for r in at_t]))
        assert m["recall_by_position"] == pytest.approx(recall)
        assert m["rstd"] == pytest.approx(np.std(recall, ddof=1))
        selection = [100 * np.mean([r["predicted_position"] == j for r in mine]) for j in range(N)]
        assert m["selection_by_position"] == pytest.approx(selection)
        consistent = 0
        for i in range(ITEMS):
            chosen = {
                r["order"][r["predicted_position"]] if r["predicted_position"] is not None else None
                for r in mine
                if r["item"] == f"it{i}"
            }
            consistent += chosen != {None} and len(chosen) == 1
        assert m["cons"] == pytest.approx(100 * consistent / ITEMS)
        rr = []
        for r in mine:
            p = np.asarray(r["probabilities"])
            g = p[r["gt_position"]]
            rr.append(1 / (1 + (p > g).sum() + ((p == g).sum() - 1) / 2))
        assert m["mrr"] == pytest.approx(np.mean(rr))
        assert m["generation_based"] is (method == "cot")
    cot = run["methods"]["cot"]
    nones = [r for r in records if r["method"] == "cot" and r["predicted_position"] is None]
    assert cot["unparseable_pct"] == pytest.approx(100 * len(nones) / (ITEMS * T))
    assert sum(cot["selection_by_position"]) == pytest.approx(100 - cot["no_answer_pct"])
    paired = run["paired"]["agd-vanilla"]
    agd = {(r["item"], r["ordering"]): r["correct"] for r in records if r["method"] == "agd"}
    van = {(r["item"], r["ordering"]): r["correct"] for r in records if r["method"] == "vanilla"}
    assert paired["diff"] == pytest.approx(100 * np.mean([agd[k] - van[k] for k in agd]))
    assert paired["rescues"] == sum(agd[k] and not van[k] for k in agd)
    assert paired["harms"] == sum(van[k] and not agd[k] for k in agd)
    assert paired["inside_noise"] == (paired["ci"][0] <= 0 <= paired["ci"][1])
    assert set(run["paired"]) == {"agd-vanilla", "cot-vanilla"}
    auc = run["diagnostics"]["roc_auc"]["logits"]
    assert len(auc) == N and all(0 <= a <= 1 for a in auc)


def test_vanilla_position_bias_is_outside_its_noise_floor() -> None:
    (run,) = compute_metrics(_records(1), samples=200)["runs"]
    vanilla = run["methods"]["vanilla"]
    assert vanilla["rstd"] > vanilla["rstd_noise_floor"]
    assert vanilla["selection_by_position"][0] > 60


def test_incomplete_records_are_refused() -> None:
    records = _records()[:-1]
    with pytest.raises(ValueError, match="records, expected"):
        compute_metrics(records)


def test_a_constant_predictor_has_a_degenerate_ci_and_recall_cis() -> None:
    from lad_lab.eval.metrics import compute_metrics
    from lad_lab.eval.records import make_record
    from lad_lab.eval.report import _ci

    n, records = 4, []
    for item in range(6):
        for o in range(n):  # balanced: the GT at every position once, always answered "1"
            records.append(
                make_record(
                    item=f"i{item}",
                    n=n,
                    setting="s",
                    dataset="d",
                    ordering=o,
                    order=[(p + o) % n for p in range(n)],
                    method="vanilla",
                    gt_position=o,
                    probabilities=[1.0, 0.0, 0.0, 0.0],
                    predicted_position=0,
                    forward_passes=1,
                    latency_ms=1.0,
                )
            )
    m = compute_metrics(records, samples=200)["runs"][0]["methods"]["vanilla"]
    assert m["acc"] == 25.0 and m["acc_ci"] == [25.0, 25.0] and m["acc_ci_degenerate"]
    assert _ci(m["acc_ci"]).startswith("[25.0, 25.0] (degenerate")
    assert m["recall_ci"][0] == [100.0, 100.0] and m["recall_ci"][1] == [0.0, 0.0]
