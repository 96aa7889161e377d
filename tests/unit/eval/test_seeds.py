"""The summary over item seeds: mean and range beside the first seed's CI, degenerate CIs
flagged, and the simulation labelled."""

from __future__ import annotations

from app.eval.seeds import render, summarise


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
    assert "| vanilla | 13.2 (12.5 to 14.0) | [12.5, 12.5] (degenerate" in text
    assert "| agd − vanilla | +3.4 (+0.5 to +8.2) | [+7.2, +9.2] | 2 of 3 |" in text
    assert "SIMULATION" not in text
    assert "SIMULATION" in render({**summary, "dataset": "simulated"}, "x")
