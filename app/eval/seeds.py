"""``lad eval --item-seeds S1 S2 ...``: the same evaluation on several item draws, and the
headline table over them: mean and range across seeds, the first seed's CI, and the
*pooled* figure (every seed's items together, one item-bootstrap CI over all of them) with
the count of seeds whose own paired CI excludes 0.

One seed's bootstrap CI says how well *these* items pin a number down; it does not say how
much the number moves on another draw of items (docs/results/demo_seeds/seeds.md shows a
gain whose per-seed CIs disagree). The pooled figure is the one the docs state. Each
seed's full run lands in ``seed_<s>/``; ``seeds.json`` and ``seeds.md`` hold the summary,
recomputable from the folder with ``python -m app.eval.seeds DIR``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from app.eval.report import DEGENERATE, SIMULATION_BANNER, table

POOLED = ("vanilla", "pride", "attn_raw", "attn_pure", "agd", "perm_avg")
"""Methods whose pooled accuracy the summary keeps (those a run has)."""


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


def pooled(folders: dict[int, Path], samples: int, seed: int) -> list[dict[str, Any]]:
    """Per (n, setting): accuracy and paired differences over every seed's items together
    (item ids prefixed by their seed), from each seed's predictions.jsonl."""
    from app.eval.metrics import compute_metrics
    from app.eval.records import read_records

    records = []
    for s, folder in folders.items():
        for r in read_records(folder / "predictions.jsonl"):
            records.append({**r, "item": f"{s}:{r['item']}"})
    metrics = compute_metrics(records, samples=samples, seed=seed)
    return [
        {
            "n": run["n"],
            "setting": run["setting"],
            "items": run["items"],
            "methods": {
                m: {"acc": v["acc"], "acc_ci": v["acc_ci"]} for m, v in run["methods"].items()
            },
            "paired": {
                p: {"diff": v["diff"], "ci": v["ci"], "inside_noise": v["inside_noise"]}
                for p, v in run["paired"].items()
            },
        }
        for run in metrics["runs"]
    ]


def attach_pooled(summary: dict[str, Any], folders: dict[int, Path], config: Any) -> None:
    """Add each run's pooled block to ``summary`` (same order of runs)."""
    for run, pool in zip(
        summary["runs"], pooled(folders, config.bootstrap, config.bootstrap_seed), strict=True
    ):
        run["pooled"] = pool


def _range(s: dict[str, Any], sign: bool = False) -> str:
    f = "+.1f" if sign else ".1f"
    return f"{s['mean']:{f}} ({s['min']:{f}} to {s['max']:{f}})"


def _ci(ci: Sequence[float], degenerate: bool = False, sign: bool = False) -> str:
    f = "+.1f" if sign else ".1f"
    text = f"[{ci[0]:{f}}, {ci[1]:{f}}]"
    return f"{text} ({DEGENERATE})" if degenerate or ci[1] - ci[0] < 1e-9 else text


def _pooled(block: dict[str, Any] | None, value: str, ci: str, sign: bool = False) -> str:
    if block is None:
        return "–"
    f = "+.1f" if sign else ".1f"
    return f"{block[value]:{f}} {_ci(block[ci], sign=sign)}"


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
        "items; calibration items, orderings and bootstrap seeds fixed). Pooled: every "
        "seed's items together with one item-bootstrap 95% CI over all of them (the figure "
        "the docs state); then the mean over the seeds (min to max) and the CI of seed "
        f"{seeds[0]} alone: the range is how much a number moves on another draw, the CI "
        "how well one draw pins it.",
        "",
    ]
    for run in summary["runs"]:
        out += [
            f"## N = {run['n']}, {run['setting']} ({run['items']} items x "
            f"{run['orderings']} orderings per seed)",
            "",
        ]
        pool = run.get("pooled", {"methods": {}, "paired": {}})
        rows = [
            [
                m,
                _pooled(pool["methods"].get(m), "acc", "acc_ci"),
                _range(s),
                _ci(s["first_seed_ci"], s["first_seed_ci_degenerate"]),
                _range(s["rstd"]),
            ]
            for m, s in run["methods"].items()
        ]
        head = ["method", "Acc % pooled [95% CI]", "mean (range) over seeds"]
        out += [table([*head, f"seed {seeds[0]} 95% CI", "RStd mean (range)"], rows), ""]
        rows = [
            [
                p.replace("-", " − "),
                _pooled(pool["paired"].get(p), "diff", "ci", sign=True),
                _range(s, True),
                _ci(s["first_seed_ci"], sign=True),
                f"{s['seeds_ci_excludes_0']} of {len(seeds)}",
            ]
            for p, s in run["paired"].items()
        ]
        head = ["a − b", "Δ points pooled [95% CI]", "mean (range) over seeds"]
        head += [f"seed {seeds[0]} paired 95% CI", "seeds whose CI excludes 0"]
        out += [table(head, rows), ""]
    return "\n".join(out)


def run_seeds(runner: Any, config: Any, seeds: Sequence[int]) -> dict[str, Any]:
    """Every seed's run into ``seed_<s>/``, then seeds.json and seeds.md into ``config.out``."""
    from app.eval.harness import run_evaluation

    if len(set(seeds)) != len(seeds) or not seeds:
        raise ValueError("--item-seeds needs distinct seeds")
    per_seed, folders = {}, {}
    for seed in seeds:
        folders[seed] = config.out / f"seed_{seed}"
        sub = replace(config, eval_seed=seed, out=folders[seed], item_seeds=None)
        per_seed[seed] = run_evaluation(runner, sub)
    summary = summarise(per_seed)
    attach_pooled(summary, folders, config)
    summary.update(command=config.command, dataset=config.dataset)
    (config.out / "seeds.json").write_text(json.dumps(summary, indent=1) + "\n")
    (config.out / "seeds.md").write_text(render(summary, config.command))
    return summary


def resummarise(folder: Path, command: str | None = None) -> dict[str, Any]:
    """seeds.json and seeds.md of ``folder`` again from its ``seed_<s>/`` runs (the pooled
    figures included), e.g. after the runs were moved; ``command``: the one to print."""
    from app.eval.stats import BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED

    folders = {
        int(p.name.removeprefix("seed_")): p
        for p in sorted(Path(folder).glob("seed_*"), key=lambda p: int(p.name[5:]))
    }
    per_seed = {s: json.loads((f / "metrics.json").read_text()) for s, f in folders.items()}
    first = next(iter(per_seed.values()))["config"]
    summary = summarise(per_seed)
    boot = SimpleNamespace(
        bootstrap=first.get("bootstrap", BOOTSTRAP_SAMPLES),
        bootstrap_seed=first.get("bootstrap_seed", BOOTSTRAP_SEED),
    )
    attach_pooled(summary, folders, boot)
    command = command or first.get("command", "")
    summary.update(command=command, dataset=first.get("dataset"))
    (Path(folder) / "seeds.json").write_text(json.dumps(summary, indent=1) + "\n")
    (Path(folder) / "seeds.md").write_text(render(summary, command))
    return summary


if __name__ == "__main__":  # python -m app.eval.seeds DIR ["the command to print"]
    resummarise(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None)
