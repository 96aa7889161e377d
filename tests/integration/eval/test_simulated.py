"""``lad eval --dataset simulated``: the score-level simulation through the service's
calibration and method code, its stages with paired CIs, and each ablation as one flag."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lad_lab.eval import cli
from lad_lab.eval.datasets import open_dataset
from lad_lab.eval.datasets.simulated import SimulatedBackend
from lad_lab.eval.harness import EvalConfig, run_evaluation
from lad_lab.eval.records import read_records

STAGES = ["vanilla", "pride", "attn_raw", "attn_pure", "agd"]


def _run(tmp_path, **overrides) -> dict:
    values = {
        "out": tmp_path,
        "dataset": "simulated",
        "items": 150,
        "progress": False,
        "bootstrap": 500,
        "methods": STAGES,
    }
    values.update(overrides)
    return run_evaluation(SimulatedBackend(), EvalConfig(**values))["runs"][0]


def test_the_backend_is_a_deterministic_function_of_its_input() -> None:
    items = open_dataset("simulated").items(3, 4, "adversarial", seed=1)
    backend = SimulatedBackend()
    a, b = backend.forward(items), backend.forward(items)
    np.testing.assert_array_equal(a.scores, b.scores)
    assert a.scores.shape == (3, 4) and a.attention.shape == (3, 15, 4)
    np.testing.assert_allclose(np.exp(a.scores).sum(axis=1), 1.0)
    assert len(backend.layers) == 15
    again = open_dataset("simulated").items(3, 4, "adversarial", seed=1)
    assert [i.id for i in items] == [i.id for i in again]


def test_each_stage_adds_with_a_paired_ci(tmp_path) -> None:
    run = _run(tmp_path)
    paired = run["paired"]
    assert paired["attn_pure-attn_raw"]["ci"][0] > 0  # dividing out the prior
    assert paired["agd-attn_pure"]["ci"][0] > 0  # the conditional bias correction
    assert paired["agd-vanilla"]["ci"][0] > 0
    text = (tmp_path / "report.md").read_text()
    assert "(SIMULATION)" in text and "SIMULATION." in text
    assert json.loads((tmp_path / "protocol.json").read_text())["dataset"]["name"] == "simulated"


def test_ablation_flags(tmp_path) -> None:
    zero = _run(tmp_path / "b0", items=40, zero_bias=True, methods=["vanilla", "agd"])
    records = read_records(tmp_path / "b0" / "predictions.jsonl")
    by = {}
    for r in records:
        by.setdefault(r["method"], []).append(r["predicted_position"])
    assert by["agd"] == by["vanilla"]  # B = 0: d = s
    assert zero["paired"]["agd-vanilla"]["diff"] == 0.0
    _run(tmp_path / "np", items=40, no_prior=True, methods=["attn_raw", "attn_pure"])
    r = read_records(tmp_path / "np" / "predictions.jsonl")
    raw = [x["predicted_position"] for x in r if x["method"] == "attn_raw"]
    pure = [x["predicted_position"] for x in r if x["method"] == "attn_pure"]
    assert raw == pure  # without the prior, π ranks as ā
    every = _run(tmp_path / "all", items=40, all_layers=True, methods=["agd"])
    top2 = _run(tmp_path / "k2", items=40, methods=["agd"])
    assert every["methods"]["agd"]["acc"] != top2["methods"]["agd"]["acc"]
    low = _run(tmp_path / "tau", items=40, tau=0.5, methods=["agd"])
    assert low["methods"]["agd"]["acc"] != top2["methods"]["agd"]["acc"]


def test_the_command_refuses_methods_that_need_a_text_model(tmp_path) -> None:
    with pytest.raises(SystemExit, match="in-process model"):
        cli.main(["--dataset", "simulated", "--methods", "agd", "cot", "--out", str(tmp_path)])
