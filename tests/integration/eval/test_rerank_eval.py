"""``lad eval rerank`` on the demo model, a slice: tournaments of every method with their
cost and CIs, the any-N calibration comparison, the report, and the CLI entry."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from app.method.methods import MethodConfig, apply_method
from app.method.tournament import window_sizes
from lad_lab.eval import cli
from lad_lab.eval import rerank as R
from lad_lab.eval.datasets import open_dataset
from lad_lab.eval.datasets.synthetic import image_size_for


@pytest.fixture(scope="module")
def runner(shared_runner):
    return shared_runner("demo")


def _argv(out: Path) -> list[str]:
    return [
        "--items",
        "3",
        "--candidates",
        "7",
        "--window",
        "3",
        "--multi-n",
        "3",
        "--orderings",
        "3",
        "--calibration",
        "2",
        "--bootstrap",
        "100",
        "--out",
        str(out),
    ]


def _args(out: Path):
    return R.build_parser().parse_args(_argv(out))


def test_tournaments_cost_and_ci(runner, tmp_path):
    args = _args(tmp_path)
    dataset = open_dataset("synthetic", image_size=image_size_for(runner))
    [run] = R.rerank_part(runner, dataset, args, MethodConfig())
    sizes = window_sizes(7, 3, 1)
    assert sizes == [[3, 2, 2], [3]]
    assert run["forward_passes"]["vanilla"] == run["forward_passes"]["agd"] == 4
    assert run["forward_passes"]["perm_avg"] == sum(s for r in sizes for s in r)
    for table in (run["top1"], run["mrr"]):
        for m in R.TOURNAMENT_METHODS:
            lo, hi = table[m]["ci"]
            assert lo <= table[m]["mean"] <= hi
    assert 1 / 7 <= run["mrr"]["vanilla"]["mean"] <= 1
    d = run["paired_top1"]["agd - vanilla"]
    assert d["mean"] == pytest.approx(run["top1"]["agd"]["mean"] - run["top1"]["vanilla"]["mean"])


def test_one_calibration_for_every_n_equals_a_direct_one_at_full_size(runner):
    """n = all on examples of C images gives, at N = C, exactly the direct calibration; the
    evidence cache never mixes the two."""
    dataset = open_dataset("synthetic", image_size=image_size_for(runner))
    items = dataset.items(2, 4, "random", 2002)
    evidence = R.Evidence(runner, 8)
    every = R.calibrate_sizes(evidence, items, [2, 3, 4], "all")
    direct = R.calibrate_sizes(evidence, items, [4], "direct")
    assert np.allclose(every[4].bias_matrix, direct[4].bias_matrix, atol=1e-6)
    assert every[2].bias_matrix.shape == (2, 2)
    assert evidence.computed == 2 * (2 + 3 + 4) + 2 * 4


def test_cli_writes_the_report(runner, tmp_path, monkeypatch):
    import app.models.loader as loader

    monkeypatch.setattr(loader, "load_runner", lambda *a, **k: runner)
    argv = ["rerank", *_argv(tmp_path)]
    assert cli.main(argv) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["command"].startswith("lad eval rerank --items 3")
    [multi] = metrics["multi_n"]
    assert multi["n"] == 3 and multi["orderings"] == 3
    assert set(multi["acc"]) == {"n=all on 12", "direct N=3", "vanilla"}
    report = (tmp_path / "report.md").read_text()
    assert "## Rerank 7 candidates, window 3" in report and "agd - vanilla" in report
    assert "profile from n = all on 12 candidates" in report


def test_agd_in_a_window_is_the_engine_method(runner):
    """play() applies the engine's own method to the window's evidence."""
    dataset = open_dataset("synthetic", image_size=image_size_for(runner))
    item = dataset.items(1, 3, "random", 3003)[0]
    evidence = R.Evidence(runner, 8)
    from lad_lab.eval.datasets import open_image

    images = [open_image(im) for im in item.images]
    ranking, spent = R.play(evidence, item, images, "vanilla", 3, {}, MethodConfig(), seed=0)
    assert spent == 1 and sorted(ranking) == [0, 1, 2]
    [(key, (s, a))] = list(evidence.cache.items())
    order = list(key[1:])
    p = apply_method("vanilla", s, a).probabilities
    assert ranking == [order[i] for i in np.argsort(-p, kind="stable")]
