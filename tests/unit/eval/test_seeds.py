"""The summary over item seeds: mean and range beside the first seed's CI, degenerate CIs
flagged, and the simulation labelled."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lad_lab.eval import cli
from lad_lab.eval.seeds import render, resummarise, summarise


def _metrics(acc: float, diff: float, ci: list[float]) -> dict:
    method = {"acc": acc, "acc_ci": ci, "acc_ci_degenerate": ci[0] == ci[1], "rstd": 3.0}
    return {
        "runs": [
            {
                "n": 4,
                "setting": "adversarial",
                "items": 10,
                "orderings": 4,
                "methods": {"vanilla": method, "agd": {**method, "acc": acc + diff}},
                "paired": {
                    "agd-vanilla": {
                        "diff": diff,
                        "ci": [diff - 1, diff + 1],
                        "inside_noise": diff < 1,
                    }
                },
            }
        ]
    }


def test_summary_over_seeds() -> None:
    per_seed = {
        1: _metrics(12.5, 8.2, [12.5, 12.5]),
        2: _metrics(14.0, 1.4, [10.0, 18.0]),
        3: _metrics(13.0, 0.5, [9.0, 17.0]),
    }
    summary = summarise(per_seed)
    (run,) = summary["runs"]
    agd_gain = run["paired"]["agd-vanilla"]
    assert agd_gain["values"] == [8.2, 1.4, 0.5] and agd_gain["min"] == 0.5
    assert abs(agd_gain["mean"] - 10.1 / 3) < 1e-9 and agd_gain["seeds_ci_excludes_0"] == 2
    assert run["methods"]["vanilla"]["first_seed_ci_degenerate"] is True
    text = render(summary, "lad eval --item-seeds 1 2 3")
    assert "| vanilla | – | 13.2 (12.5 to 14.0) | [12.5, 12.5] (degenerate" in text
    assert "| agd − vanilla | – | +3.4 (+0.5 to +8.2) | [+7.2, +9.2] | 2 of 3 |" in text
    assert "SIMULATION" not in text
    assert "SIMULATION" in render({**summary, "dataset": "simulated"}, "x")


def test_pooled_figures_over_every_seeds_items(tmp_path) -> None:
    """The pooled block: all seeds' items in one bootstrap (a narrower CI than one seed's),
    its accuracy the mean of equal-sized seeds', and recomputable from the folder."""
    out = tmp_path / "sim"
    argv = ["--dataset", "simulated", "-n", "4", "--items", "30", "--item-seeds", "21", "22"]
    argv += ["--methods", "vanilla", "agd", "--bootstrap", "200", "--quiet", "--out", str(out)]
    assert cli.main(argv) == 0
    summary = json.loads((out / "seeds.json").read_text())
    (run,) = summary["runs"]
    pool = run["pooled"]
    assert pool["items"] == 60
    seeds = [json.loads((out / f"seed_{s}" / "metrics.json").read_text()) for s in (21, 22)]
    accs = [m["runs"][0]["methods"]["agd"]["acc"] for m in seeds]
    assert abs(pool["methods"]["agd"]["acc"] - np.mean(accs)) < 1e-9
    width = pool["methods"]["agd"]["acc_ci"][1] - pool["methods"]["agd"]["acc_ci"][0]
    first = seeds[0]["runs"][0]["methods"]["agd"]["acc_ci"]
    assert width < first[1] - first[0]
    diff = pool["paired"]["agd-vanilla"]
    assert diff["ci"][0] <= diff["diff"] <= diff["ci"][1]
    assert "Acc % pooled [95% CI]" in (out / "seeds.md").read_text()
    again = resummarise(out)
    assert again["runs"][0]["pooled"] == pool


def test_an_ablation_paired_with_the_full_run_item_for_item(tmp_path) -> None:
    """``--versus``: each method of an ablation against the same method of the full run on
    the same items; a method the flag leaves alone differs by exactly 0, the one it changes
    by the difference of the pooled accuracies, and other item seeds are refused."""
    common = ["--dataset", "simulated", "-n", "4", "--items", "30", "--methods", "attn_pure"]
    common += ["agd", "--bootstrap", "200", "--quiet"]
    full, soft, other = tmp_path / "full", tmp_path / "soft", tmp_path / "other"
    assert cli.main([*common, "--item-seeds", "21", "22", "--out", str(full)]) == 0
    argv = [*common, "--item-seeds", "21", "22", "--tau", "1", "--out", str(soft)]
    assert cli.main(argv) == 0
    summary = resummarise(soft, full=full)
    (run,) = summary["versus"]["runs"]
    assert summary["versus"]["folder"] == "../full"
    same = run["paired"]["attn_pure"]
    assert same["diff"] == 0.0 and same["ci"] == [0.0, 0.0] and same["seeds_ci_excludes_0"] == 0
    agd = run["paired"]["agd"]
    ours = summary["runs"][0]["pooled"]["methods"]["agd"]["acc"]
    theirs = json.loads((full / "seeds.json").read_text())["runs"][0]["pooled"]["methods"]
    assert abs(agd["diff"] - (ours - theirs["agd"]["acc"])) < 1e-9 and len(agd["per_seed"]) == 2
    assert "agd − agd there" in (soft / "seeds.md").read_text()
    argv = [*common, "--item-seeds", "23", "24", "--out", str(other)]
    assert cli.main(argv) == 0
    with pytest.raises(ValueError, match=r"same item seeds' predictions: no .*seed_23"):
        resummarise(other, full=full)
