"""``lad eval --item-seeds S1 S2 ...``: the same evaluation on several item draws, and the
headline table over them: mean and range across seeds, the first seed's CI, and the
*pooled* figure (every seed's items together, one item-bootstrap CI over all of them) with
the count of seeds whose own paired CI excludes 0.

One seed's bootstrap CI says how well *these* items pin a number down; it does not say how
much the number moves on another draw of items (docs/results/demo_seeds/seeds.md shows a
gain whose per-seed CIs disagree). The pooled figure is the one the docs state. Each
seed's full run lands in ``seed_<s>/``; ``seeds.json`` and ``seeds.md`` hold the summary,
recomputable from the folder with ``python -m lad_lab.eval.seeds DIR``; ``--versus FULL`` adds
each method paired with the same method of a run on the same item seeds (an ablation
against the full method, item for item).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from lad_lab.eval import stats
from lad_lab.eval.report import DEGENERATE, SIMULATION_BANNER, table

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
    from lad_lab.eval.metrics import compute_metrics
    from lad_lab.eval.records import read_records

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


def _paired_runs(
    mine: list[dict[str, Any]], full: list[dict[str, Any]], samples: int, seed: int
) -> dict[tuple[int, str], dict[str, dict[str, Any]]]:
    """Per (n, setting) of ``mine``, each method also in ``full``: mine − full, paired on the
    same (item, ordering) instances (ValueError: not the same items)."""
    from lad_lab.eval.metrics import paired_metrics
    from lad_lab.eval.records import Group

    out: dict[tuple[int, str], dict[str, dict[str, Any]]] = {}
    for n, setting in dict.fromkeys((int(r["n"]), r["setting"]) for r in mine):
        ours = [r for r in mine if int(r["n"]) == n and r["setting"] == setting]
        theirs = [r for r in full if int(r["n"]) == n and r["setting"] == setting]
        both = [
            m
            for m in dict.fromkeys(r["method"] for r in ours)
            if m in {r["method"] for r in theirs}
        ]
        group = Group(
            n,
            setting,
            [r for r in ours if r["method"] in both]
            + [{**r, "method": f"{r['method']}@full"} for r in theirs if r["method"] in both],
        )
        indices = stats.bootstrap_indices(len(group.items), samples, seed)
        out[(n, setting)] = {}
        for m in both:
            if not np.array_equal(group.by_method[m]["gt"], group.by_method[f"{m}@full"]["gt"]):
                raise ValueError(f"N={n} {setting}: the two runs' items differ (other seeds?)")
            out[(n, setting)][m] = paired_metrics(
                group.by_method[m], group.by_method[f"{m}@full"], indices
            )
    return out


def versus(folders: dict[int, Path], full: Path, samples: int, seed: int) -> list[dict[str, Any]]:
    """Each run's methods against the same method in the run at ``full`` (e.g. an ablation
    against the full method) on the same items: the paired difference pooled over every
    seed's items, each seed's own, and how many seeds' own CI excludes 0."""
    from lad_lab.eval.records import read_records

    def records(folder: Path, prefix: str) -> list[dict[str, Any]]:
        return [
            {**r, "item": f"{prefix}{r['item']}"}
            for r in read_records(folder / "predictions.jsonl")
        ]

    missing = [
        str(full / f.name / "predictions.jsonl")
        for f in folders.values()
        if not (full / f.name / "predictions.jsonl").exists()
    ]
    if missing:
        raise ValueError(f"--versus needs the same item seeds' predictions: no {missing[0]}")
    per_seed = {
        s: _paired_runs(records(f, ""), records(full / f.name, ""), samples, seed)
        for s, f in folders.items()
    }
    pool = _paired_runs(
        [r for s, f in folders.items() for r in records(f, f"{s}:")],
        [r for s, f in folders.items() for r in records(full / f.name, f"{s}:")],
        samples,
        seed,
    )
    return [
        {
            "n": n,
            "setting": setting,
            "paired": {
                m: {
                    "diff": p["diff"],
                    "ci": p["ci"],
                    "inside_noise": p["inside_noise"],
                    "per_seed": [per_seed[s][(n, setting)][m]["diff"] for s in folders],
                    "seeds_ci_excludes_0": sum(
                        not per_seed[s][(n, setting)][m]["inside_noise"] for s in folders
                    ),
                }
                for m, p in methods.items()
            },
        }
        for (n, setting), methods in pool.items()
    ]


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
    if "versus" in summary:
        out += _render_versus(summary["versus"], len(seeds))
    return "\n".join(out)


def _render_versus(block: dict[str, Any], k: int) -> list[str]:
    out = [f"## Against the same method in `{block['folder']}` (same items and orderings)", ""]
    for run in block["runs"]:
        rows = [
            [
                f"{m} − {m} there",
                _pooled(p, "diff", "ci", sign=True),
                ", ".join(f"{d:+.1f}" for d in p["per_seed"]),
                f"{p['seeds_ci_excludes_0']} of {k}",
            ]
            for m, p in run["paired"].items()
        ]
        head = ["a − b", "Δ points pooled [95% CI]", "each seed", "seeds whose CI excludes 0"]
        out += [f"N = {run['n']}, {run['setting']}:", "", table(head, rows), ""]
    return out


def run_seeds(runner: Any, config: Any, seeds: Sequence[int]) -> dict[str, Any]:
    """Every seed's run into ``seed_<s>/``, then seeds.json and seeds.md into ``config.out``."""
    from lad_lab.eval.harness import run_evaluation

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


def resummarise(
    folder: Path, command: str | None = None, full: Path | None = None
) -> dict[str, Any]:
    """seeds.json and seeds.md of ``folder`` again from its ``seed_<s>/`` runs (the pooled
    figures included), e.g. after the runs were moved; ``command``: the one to print;
    ``full``: a run on the same item seeds to pair every method against (``versus``)."""
    from lad_lab.eval.stats import BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED

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
    if full is not None:
        rel = os.path.relpath(full, folder)
        runs = versus(folders, Path(full), boot.bootstrap, boot.bootstrap_seed)
        summary["versus"] = {"folder": rel, "runs": runs}
    (Path(folder) / "seeds.json").write_text(json.dumps(summary, indent=1) + "\n")
    (Path(folder) / "seeds.md").write_text(render(summary, command))
    return summary


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m lad_lab.eval.seeds", description="seeds.json and seeds.md of DIR again"
    )
    parser.add_argument("folder", type=Path, metavar="DIR")
    parser.add_argument("command", nargs="?", help="the command to print in seeds.md")
    parser.add_argument(
        "--versus",
        type=Path,
        metavar="FULL",
        help="a run on the same item seeds (its seed_<s>/predictions.jsonl): pair each "
        "method of DIR against the same method there, e.g. an ablation against the full run",
    )
    args = parser.parse_args(argv)
    resummarise(args.folder, args.command, args.versus)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
