"""``lad eval rerank --ranking``: the full ranking (top_n = C) as the service plays it
against the exhaustive tournament, on the demo model, a slice; and its metrics."""

from __future__ import annotations

import json

import numpy as np
import pytest

from app.method.methods import MethodConfig
from app.method.tournament import window_sizes
from lad_lab.demo import world
from lad_lab.eval import cli
from lad_lab.eval import rerank as R
from lad_lab.eval import rerank_ranking as RR
from lad_lab.eval.datasets import open_dataset
from lad_lab.eval.datasets.synthetic import image_size_for


@pytest.fixture(scope="module")
def runner(shared_runner):
    return shared_runner("demo")


def test_ndcg_and_tau() -> None:
    gains = np.array([0.0, 31.0, 7.0, 0.0])
    assert RR.ndcg_at([1, 2, 0, 3], gains) == pytest.approx(1.0)
    assert RR.ndcg_at([0, 3, 2, 1], gains) < RR.ndcg_at([2, 1, 0, 3], gains) < 1.0
    one = np.array([0.0, 1.0, 0.0])
    assert RR.ndcg_at([0, 2, 1], one) == pytest.approx(1 / np.log2(4))
    assert RR.ndcg_at(list(range(12)), np.eye(12)[11], k=10) == 0.0  # below the cut-off
    assert RR.kendall_tau([0, 1, 2, 3], [0, 1, 2, 3]) == 1.0
    assert RR.kendall_tau([0, 1, 2, 3], [3, 2, 1, 0]) == -1.0
    assert RR.kendall_tau([0, 1, 2], [1, 0, 2]) == pytest.approx(1 / 3)


def test_attribute_gains_grade_by_the_query_attributes() -> None:
    dataset = open_dataset("synthetic", image_size=32)
    item = dataset.items(1, 20, "random", 3003)[0]
    gains = RR.attribute_gains(item, 20, 32)
    example = world.make_item(0, 20, "random", 3003, 32)
    assert gains[item.answer] == 31.0 and gains.argmax() == item.answer
    shared = [
        5 - len(world.attribute_difference(a, example.attributes[example.target]))
        for a in example.attributes
    ]
    assert np.array_equal(gains, np.exp2(shared) - 1)


def _argv(out) -> list[str]:
    return [
        "--items", "3", "--candidates", "--multi-n", "--ranking", "10", "--window", "4",
        "--calibration", "2", "--bootstrap", "100", "--item-seeds", "3021", "3022",
        "--out", str(out),
    ]  # fmt: skip


def test_full_ranking_part(runner, tmp_path) -> None:
    args = R.build_parser().parse_args(_argv(tmp_path))
    dataset = open_dataset("synthetic", image_size=image_size_for(runner))
    [run] = RR.ranking_part(runner, dataset, args, MethodConfig())
    assert run["items"] == 6 and run["item_seeds"] == [3021, 3022]
    schemes = run["methods"]["agd"]["schemes"]
    cost = {name: s["forward_passes"]["mean"] for name, s in schemes.items()}
    planned = {
        "exhaustive": window_sizes(10, 4, 10, "runners_up"),
        "halving": window_sizes(10, 4, 10, "halving"),
        "top-1": window_sizes(10, 4, 1),
    }
    assert cost == {name: float(sum(map(len, r))) for name, r in planned.items()}
    assert schemes["exhaustive"]["tau"]["mean"] == 1.0
    for s in schemes.values():
        for metric in ("ndcg10", "ndcg10_graded", "tau"):
            lo, hi = s[metric]["ci"]
            assert lo <= s[metric]["mean"] <= hi and lo >= -1.0 and hi <= 1.0
        assert set(s["ndcg10"]["per_seed"]) == {"3021", "3022"}
    d = run["methods"]["agd"]["paired"]["halving - exhaustive"]["ndcg10"]
    assert d["mean"] == pytest.approx(
        schemes["halving"]["ndcg10"]["mean"] - schemes["exhaustive"]["ndcg10"]["mean"]
    )


def test_cli_writes_the_ranking_report(runner, tmp_path, monkeypatch) -> None:
    import app.models.loader as loader

    monkeypatch.setattr(loader, "load_runner", lambda *a, **k: runner)
    assert cli.main(["rerank", *_argv(tmp_path)]) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert "rerank" not in metrics and "multi_n" not in metrics
    [run] = metrics["ranking"]
    assert run["candidates"] == 10
    report = (tmp_path / "report.md").read_text()
    assert "## Full ranking of 10 documents, window 4, agd" in report
    assert "| halving - exhaustive | ndcg10 |" in report
