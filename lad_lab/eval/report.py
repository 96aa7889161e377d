"""report.md from metrics.json: the command and seeds first, then per (n, setting) the table
with CIs and the RStd noise floor, recall by position, the paired differences, the
diagnostics and the figures."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lad_lab.eval.records import run_key

GENERATION_NOTE = (
    "`cot` and `self_consistency` are generation-based (`model.generate()`, answers parsed "
    'from "The answer is <label>"; unparseable answers count as wrong and are reported). '
    "The demo model was trained on the vanilla prompt only, so on it these baselines and "
    "`instruction` are plumbing checks, not measurements of the prompting strategies."
)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table, first column left-aligned, the others right-aligned."""
    rule = "|:--|" + "--:|" * (len(header) - 1)
    return "\n".join(
        ["| " + " | ".join(header) + " |", rule, *("| " + " | ".join(r) + " |" for r in rows)]
    )


def _f(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


DEGENERATE = "degenerate: every item scores the same, e.g. a constant predictor"

SIMULATION_BANNER = (
    "> **SIMULATION.** These numbers come from `--dataset simulated`, a seeded score-level "
    "simulation of the paper's regime (lad_lab/eval/datasets/simulated.py), not from a model. "
    "They show what each stage of the method does when its premises hold, through the same "
    "calibration and method code as the service."
)


def _ci(ci: Sequence[float]) -> str:
    """[lo, hi]; a zero-width interval is flagged: it is no precision, only no spread."""
    text = f"[{ci[0]:.1f}, {ci[1]:.1f}]"
    return f"{text} ({DEGENERATE})" if ci[1] - ci[0] < 1e-9 else text


ORDERINGS_NOTE = {
    "ours": "Every item is shown with its GT at every position equally often (balanced "
    "orderings: random base permutations, each with its N cyclic shifts).",
    "paper": "Every item is shown under the same T orderings, the identity and T - 1 random "
    "permutations (the authors' protocol; protocol.json lists them).",
}

PERM_AVG_NOTE = {
    "ours": "perm_avg averages the N cyclic rotations of what it is shown, and the orderings "
    "of one base permutation are those same rotations, so with T = N its answer per image "
    "is identical under every ordering (Cons 100, RStd 0 by construction).",
    "paper": "perm_avg averages 16 random orders (identity first) of what it is shown "
    "(protocol.json lists them); the T orderings are shared by every item, so GT positions "
    "are balanced only in expectation.",
}


def header(metrics: dict[str, Any]) -> str:
    c = metrics["config"]
    b = metrics["bootstrap"]
    seeds = (
        f"evaluation items {c['eval_seed']}, calibration items {c['calibration_seed']}, "
        f"orderings {c['ordering_seed']}, generation {c['generation_seed']}, "
        f"bootstrap {b['seed']} ({b['samples']} item resamples)"
    )
    layers = ", ".join(str(x) for x in c["layers"])
    prior = "none (--no-prior)" if c["no_prior"] else "divided (§2.4)"
    protocol = c.get("protocol", "ours")
    banner = [SIMULATION_BANNER, ""] if c["dataset"] == "simulated" else []
    return "\n".join(
        [
            "# lad eval report" + (" (SIMULATION)" if banner else ""),
            "",
            *banner,
            "Produced by:",
            "",
            f"    {c['command']}",
            "",
            f"- protocol `{protocol}` (every setting in protocol.json; design §2.11)",
            f"- model `{c['model']}`, dataset `{c['dataset']}`, methods {', '.join(c['methods'])}",
            f"- seeds: {seeds} (synthetic defaults: the demo world's eval and calibration "
            "splits, 3003 and 2002; the demo model was trained on split 1001)",
            f"- engine: Λ = {{{layers}}}, K = {c['top_k']}, τ = {c['tau']}, posterior "
            f"`{c['posterior_variant']}`, mixture `{c['mixture']}`, prior {prior}, sink guard "
            f"{'on' if c['sink_guard'] else 'off'}, labels `{c['labels']}`, prompt "
            f"`{c['prompt_variant']}`",
            f"- M = {c['calibration']} calibration items per run (all N rotations), never "
            "evaluation items (checked by target image)",
            f"- wall-clock {c['wall_s']} s",
            "",
            "Acc: % of (item, ordering) instances answered correctly, with the 95% item-bootstrap "
            "CI. " + ORDERINGS_NOTE[protocol] + " RStd: sample std "
            "of the recall per GT position; its *noise floor* is the RStd a position-independent "
            "method with the same accuracy shows at these counts (binomial), so an RStd near its "
            "floor is no evidence of position bias. Cons: % of items answered with the same image "
            "under all orderings. Paired differences are on the same items and orderings; "
            '"inside noise" means the 95% CI contains 0. A zero-width CI is flagged as '
            "degenerate. " + PERM_AVG_NOTE[protocol] + " Every figure is recomputable from "
            "predictions.jsonl (the calibration block from calibration.json).",
            "",
        ]
    )


def method_table(run: dict[str, Any]) -> str:
    rows = []
    for name, m in run["methods"].items():
        rows.append(
            [
                name + (" (gen.)" if m["generation_based"] else ""),
                _f(m["acc"]),
                _ci(m["acc_ci"]),
                _f(m["rstd"]),
                _ci(m["rstd_ci"]),
                _f(m["rstd_noise_floor"]),
                _f(m["cons"]),
                _f(m["mrr"], 3),
                _f(m["recall_at_k"].get("2")),
                _f(m["forward_passes_per_item"]),
                _f(m["latency_ms_per_item"], 2),
            ]
        )
    return table(
        [
            "method",
            "Acc (%)",
            "95% CI",
            "RStd",
            "RStd 95% CI",
            "noise floor",
            "Cons (%)",
            "MRR",
            "R@2 (%)",
            "passes/item",
            "ms/item",
        ],
        rows,
    )


def positions_table(run: dict[str, Any]) -> str:
    n = run["n"]
    rows = [["GT count", *(str(c) for c in run["position_counts"])]]
    for name, m in run["methods"].items():
        rows.append([f"{name} recall", *(_f(x, 0) for x in m["recall_by_position"])])
        rows.append([f"{name} selected", *(_f(x, 0) for x in m["selection_by_position"])])
    return table(["position", *(str(j + 1) for j in range(n))], rows)


def paired_table(run: dict[str, Any]) -> str:
    rows = [
        [
            pair.replace("-", " − "),
            f"{p['diff']:+.1f}",
            _ci(p["ci"]),
            str(p["rescues"]),
            str(p["harms"]),
            "inside noise" if p["inside_noise"] else "CI excludes 0",
        ]
        for pair, p in run["paired"].items()
    ]
    return table(
        [
            "a − b",
            "Δ Acc (points)",
            "paired 95% CI",
            "a right, b wrong",
            "a wrong, b right",
            "verdict",
        ],
        rows,
    )


def diagnostics_section(run: dict[str, Any]) -> list[str]:
    d, n = run["diagnostics"], run["n"]
    lines = ['ROC-AUC per position of "this position holds the match" (0.5 = uninformative):', ""]
    auc = [[s, *(_f(x, 2) for x in v)] for s, v in d["roc_auc"].items()]
    lines += [table(["signal", *(str(j + 1) for j in range(n))], auc), ""]
    if "agd_vs_attn_pure" in d:
        a = d["agd_vs_attn_pure"]
        lines += [
            f"agd vs attn_pure: {a['rescues']} rescues (agd right, attn_pure wrong), "
            f"{a['harms']} harms, same answer on {a['agreement_pct']:.1f}% of instances.",
            "",
        ]
    if "kappa_vs_scores" in d and d["kappa_vs_scores"]["kappa"] is not None:
        k = d["kappa_vs_scores"]
        lines += [
            f"κ̂ = {k['kappa']:.2f} against a mean within-instance range of the vanilla "
            f"scores s of {k['score_range']:.2f} (std {k['score_std']:.2f}); "
            f"κ̂ / range = {k['kappa_over_range']:.2f}.",
            "",
        ]
    c = run.get("calibration")
    if c:
        rows = [
            [str(p["layer"]), *(f"{x:.2e}" for x in p["prior"]), "sink" if p["sink"] else ""]
            for p in c["attention_prior"]
        ]
        lines += [
            f"Attention prior P per layer of Λ (calibration: {c['dataset']} "
            f"{c['setting']}, {len(c['items'])} items; sink = min < "
            f"{c['sink_threshold']:g}, left out of L* when the guard is on):",
            "",
            table(["layer", *(str(j + 1) for j in range(n)), "sink"], rows),
            "",
        ]
    return lines


def render(metrics: dict[str, Any], figures: dict[str, dict[str, str]]) -> str:
    parts = [header(metrics)]
    generation = False
    for run in metrics["runs"]:
        key = run_key(run["n"], run["setting"])
        generation |= any(m["generation_based"] for m in run["methods"].values())
        parts += [
            f"## N = {run['n']}, {run['setting']}",
            "",
            f"{run['items']} items x {run['orderings']} orderings; GT position counts "
            f"{run['position_counts']}.",
            "",
            method_table(run),
            "",
            "Recall and selection rate by position (%):",
            "",
            positions_table(run),
            "",
            "Paired differences:",
            "",
            paired_table(run),
            "",
            *diagnostics_section(run),
        ]
        if key in figures:
            f = figures[key]
            parts += [
                f"![GT x predicted position]({f['confusion']})",
                "",
                f"![recall by position]({f['recall']})",
                "",
            ]
    for setting, name in figures.get("accuracy_vs_n", {}).items():
        parts += [f"## Accuracy vs N, {setting}", "", f"![accuracy vs N]({name})", ""]
    if generation or "instruction" in metrics["config"]["methods"]:
        parts += ["## Prompt and generation baselines", "", GENERATION_NOTE, ""]
    return "\n".join(parts)
