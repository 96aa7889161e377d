"""``lad eval --item-seeds S1 S2 ...``: the same evaluation on several item draws, and the
headline table over them (mean and range across seeds, beside the first seed's CI).

One seed's bootstrap CI says how well *these* items pin a number down; it does not say how
much the number moves on another draw of items (on the demo model the N = 4 Adversarial
agd − vanilla gain ranged +1.4 to +7.4 over other item seeds while one seed's CI read
+8.2 [+2.9, +14.1]). Each seed's full run lands in ``seed_<s>/``; ``seeds.json`` and
``seeds.md`` hold the summary.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from app.eval.report import DEGENERATE, SIMULATION_BANNER, table


def _spread(values: Sequence[float]) -> dict[str, Any]:
    v = np.asarray(values, dtype=float)
    return {
        "values": v.tolist(),
        "mean": float(v.mean()),
        "min": float(v.min()),
        "max": float(v.max()),
    }


def summarise(per_seed: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """seeds.json from each seed's metrics.json."""
    seeds = list(per_seed)
    first = per_seed[seeds[0]]
    runs = []
    for k, run in enumerate(first["runs"]):
        same = [per_seed[s]["runs"][k] for s in seeds]
        methods = {
            m: {
                **_spread([r["methods"][m]["acc"] for r in same]),
                "first_seed_ci": run["methods"][m]["acc_ci"],
                "first_seed_ci_degenerate": run["methods"][m].get("acc_ci_degenerate", False),
                "rstd": _spread([r["methods"][m]["rstd"] for r in same]),
            }
            for m in run["methods"]
        }
        paired = {
            p: {
                **_spread([r["paired"][p]["diff"] for r in same]),
                "first_seed_ci": run["paired"][p]["ci"],
                "seeds_ci_excludes_0": sum(not r["paired"][p]["inside_noise"] for r in same),
            }
            for p in run["paired"]
        }
        runs.append(
            {
                "n": run["n"],
                "setting": run["setting"],
                "items": run["items"],
                "orderings": run["orderings"],
                "methods": methods,
                "paired": paired,
            }
        )
    return {"item_seeds": seeds, "runs": runs}


def _range(s: dict[str, Any], sign: bool = False) -> str:
    f = "+.1f" if sign else ".1f"
    return f"{s['mean']:{f}} ({s['min']:{f}} to {s['max']:{f}})"


def _ci(ci: Sequence[float], degenerate: bool = False, sign: bool = False) -> str:
    f = "+.1f" if sign else ".1f"
    text = f"[{ci[0]:{f}}, {ci[1]:{f}}]"
    return f"{text} ({DEGENERATE})" if degenerate or ci[1] - ci[0] < 1e-9 else text


def render(summary: dict[str, Any], command: str) -> str:
    """seeds.md: per (n, setting) the accuracy and the paired differences over the seeds."""
    seeds = summary["item_seeds"]
    simulated = summary.get("dataset") == "simulated"
    out = [
        "# lad eval over item seeds" + (" (SIMULATION)" if simulated else ""),
        "",
        *([SIMULATION_BANNER, ""] if simulated else []),
        "Produced by:",
        "",
        f"    {command}",
        "",
        f"Item seeds {', '.join(map(str, seeds))} ({len(seeds)} draws of the evaluation "
        "items; calibration items, orderings and bootstrap seeds fixed). Mean over the "
        f"seeds (min to max), beside the 95% item-bootstrap CI of seed {seeds[0]} alone: "
        "the range is how much a number moves on another draw, the CI how well one draw "
        "pins it.",
        "",
    ]
    for run in summary["runs"]:
        out += [
            f"## N = {run['n']}, {run['setting']} ({run['items']} items x "
            f"{run['orderings']} orderings per seed)",
            "",
        ]
        rows = [
            [
                m,
                _range(s),
                _ci(s["first_seed_ci"], s["first_seed_ci_degenerate"]),
                _range(s["rstd"]),
            ]
            for m, s in run["methods"].items()
        ]
        out += [
            table(
                ["method", "Acc % mean (range)", f"seed {seeds[0]} 95% CI", "RStd mean (range)"],
                rows,
            ),
            "",
        ]
        rows = [
            [
                p.replace("-", " − "),
                _range(s, True),
                _ci(s["first_seed_ci"], sign=True),
                f"{s['seeds_ci_excludes_0']} of {len(seeds)}",
            ]
            for p, s in run["paired"].items()
        ]
        out += [
            table(
                [
                    "a − b",
                    "Δ points mean (range)",
                    f"seed {seeds[0]} paired 95% CI",
                    "seeds whose CI excludes 0",
                ],
                rows,
            ),
            "",
        ]
    return "\n".join(out)


def run_seeds(runner: Any, config: Any, seeds: Sequence[int]) -> dict[str, Any]:
    """Every seed's run into ``seed_<s>/``, then seeds.json and seeds.md into ``config.out``."""
    from app.eval.harness import run_evaluation

    if len(set(seeds)) != len(seeds) or not seeds:
        raise ValueError("--item-seeds needs distinct seeds")
    per_seed = {}
    for seed in seeds:
        sub = replace(config, eval_seed=seed, out=config.out / f"seed_{seed}", item_seeds=None)
        per_seed[seed] = run_evaluation(runner, sub)
    summary = summarise(per_seed)
    summary.update(command=config.command, dataset=config.dataset)
    (config.out / "seeds.json").write_text(json.dumps(summary, indent=1) + "\n")
    (config.out / "seeds.md").write_text(render(summary, config.command))
    return summary
