"""``lad demo eval`` end to end on a tiny random Qwen2.5-VL: every method, valid metrics.

The tiny model is untrained, so the numbers themselves mean nothing; what is checked is
the plumbing: calibration, orderings, method readouts and perm_avg agree with an
independent unbatched recomputation, and the JSON report is complete and in range.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from app.demo import evaluate, world
from app.engine import debias
from app.engine.runner import RetrievalItem
from app.eval.metrics import evaluate_predictions
from app.eval.protocol import apply_ordering, item_orderings
from app.testing.tiny_models import build_tiny, tiny_runner

N, ITEMS, CALIBRATION_ITEMS = 3, 4, 2


@pytest.fixture(scope="module")
def runner():
    torch.set_num_threads(1)
    return tiny_runner("qwen2_5_vl")


@pytest.fixture(scope="module")
def evaluation(runner):
    return evaluate.run_eval(
        runner, n=N, items=ITEMS, calibration_items=CALIBRATION_ITEMS, batch_size=8
    )


def _check_in_range(result: dict) -> None:
    assert len(result["accuracy_per_ordering"]) == 5
    assert all(0.0 <= a <= 100.0 for a in result["accuracy_per_ordering"])
    assert result["accuracy_mean"] == pytest.approx(np.mean(result["accuracy_per_ordering"]))
    assert 0.0 <= result["accuracy_std"] <= 100.0
    assert 0.0 <= result["rstd"] <= 100.0
    assert 0.0 <= result["consistency"] <= 100.0
    confusion = np.asarray(result["confusion"])
    assert confusion.shape == (N, N)
    for t, recall in enumerate(result["recall_per_position"]):
        if recall is not None:
            assert confusion[t].sum() == pytest.approx(100.0)
            assert confusion[t, t] == pytest.approx(recall)


def test_report_has_every_method_with_valid_metrics(evaluation) -> None:
    results, report = evaluation
    assert [r.method for r in results] == list(evaluate.ROWS)
    assert set(report["methods"]) == set(evaluate.ROWS)
    for result in report["methods"].values():
        _check_in_range(result)
    json.dumps(report)  # JSON-ready as is
    b = np.asarray(report["calibration"]["bias_matrix"])
    assert b.shape == (N, N)
    assert np.all(np.diag(b)[:, None] <= b + 1e-9)  # the bias never helps the GT
    assert np.asarray(report["calibration"]["attention_prior"]).shape == (len(report["layers"]), N)
    assert report["model"]["model_id"] == "tiny-qwen2_5_vl"
    assert report["config"]["image_size"] == 56  # the tiny processor pins 56 x 56 pixels
    assert "| agd " in report["table"]


def test_methods_match_an_unbatched_recomputation(runner, evaluation) -> None:
    """vanilla, agd and perm_avg recomputed one instance per forward give the same metrics."""
    _, report = evaluation
    calibration_examples = world.make_items(CALIBRATION_ITEMS, N, "random", seed="calibration")
    scores, attention, gt = [], [], []
    for ex in calibration_examples:
        for shift in range(N):
            out = runner.forward([RetrievalItem(ex.query, debias.rotate(ex.images, shift))])
            scores.append(out.scores[0])
            attention.append(out.attention[0])
            gt.append(debias.rotated_position(ex.target, shift, N))
    b = debias.estimate_bias_matrix(np.stack(scores), np.array(gt))
    p = debias.estimate_attention_prior(np.stack(attention))
    np.testing.assert_allclose(report["calibration"]["bias_matrix"], b, atol=1e-4)

    examples = world.make_items(ITEMS, N, "random", seed="eval")
    orderings = item_orderings(N, ITEMS)
    vanilla = np.zeros((ITEMS, 5), dtype=int)
    agd = np.zeros_like(vanilla)
    perm_avg = np.zeros_like(vanilla)
    for i, ex in enumerate(examples):
        for o in range(5):
            shown = apply_ordering(ex.images, orderings[i, o])
            rotated = [RetrievalItem(ex.query, debias.rotate(shown, r)) for r in range(N)]
            out = runner.forward(rotated)
            s, a = out.scores[0], out.attention[0]
            vanilla[i, o] = np.argmax(s)
            agd[i, o] = np.argmax(debias.debias_scores(s, b, debias.attention_posterior(a, p)))
            averaged = debias.permutation_average(np.stack(out.scores), debias.rotations(N))
            perm_avg[i, o] = np.argmax(averaged)
    targets = [ex.target for ex in examples]
    for name, predicted in (("vanilla", vanilla), ("agd", agd), ("perm_avg", perm_avg)):
        expected = evaluate_predictions(name, predicted, targets, orderings).to_dict()
        got = dict(report["methods"][name])
        assert got.pop("extra") == {"forwards_per_instance": N if name == "perm_avg" else 1}
        expected.pop("extra")
        assert got == expected, name


def test_command_writes_the_json_report(tmp_path: Path, capsys) -> None:
    """``lad demo eval --model <dir>``: load by local path, print the table, write JSON."""
    model, processor = build_tiny("qwen2_5_vl")
    model.save_pretrained(tmp_path / "model")
    processor.save_pretrained(tmp_path / "model")
    out = tmp_path / "report.json"
    argv = ["--model", str(tmp_path / "model"), "--n", "2", "--setting", "adversarial",
            "--items", "3", "--calibration-items", "1", "--out", str(out), "--quiet"]  # fmt: skip
    assert evaluate.main(argv) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["config"]["setting"] == "adversarial" and report["config"]["n"] == 2
    assert set(report["methods"]) == set(evaluate.ROWS)
    for method in evaluate.ROWS:
        assert f"| {method} " in printed
    assert report["command"].startswith("lad demo eval --model")

    several = tmp_path / "several.json"
    argv = ["--model", str(tmp_path / "model"), "--n", "2", "3", "--items", "2",
            "--calibration-items", "1", "--no-perm-avg", "--out", str(several),
            "--quiet"]  # fmt: skip
    assert evaluate.main(argv) == 0
    runs = json.loads(several.read_text())["runs"]
    assert [(r["config"]["setting"], r["config"]["n"]) for r in runs] == [
        ("random", 2),
        ("random", 3),
    ]
    assert all("perm_avg" not in r["methods"] and "agd" in r["methods"] for r in runs)
