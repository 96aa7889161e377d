"""The numbers the docs state about the demo model and the simulation, generated from the
results files (``seeds.json`` of a multi-seed run, its pooled block: every seed's items
together with one item-bootstrap 95% CI, and how many seeds' own paired CI excludes 0; the
ablations paired item for item with the full run; the online streams' ``stream.json``,
single runs, which their block says).

    python -m lad_lab.eval.claims          # rewrite the blocks between the markers
    python -m lad_lab.eval.claims --check  # exit 1 if a block differs from its results file

A number in those pages outside a block is a claim nobody regenerates: keep them inside.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "docs" / "results" / "demo_seeds"
SIMULATED = ROOT / "docs" / "results" / "simulated"
METHODS = ("vanilla", "pride", "attn_raw", "attn_pure", "agd")
DEMO_PAIRS = ("agd-vanilla", "agd-attn_pure")


def _load(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "seeds.json").read_text())


def _acc(run: dict[str, Any], method: str) -> str:
    m = run["pooled"]["methods"][method]
    return f"{m['acc']:.1f} [{m['acc_ci'][0]:.1f}, {m['acc_ci'][1]:.1f}]"


def _pooled_diff(p: dict[str, Any], k: int) -> str:
    """pooled Δ [CI]; seeds whose own CI excludes 0 (e.g. a versus entry of seeds.json)."""
    if p["ci"][0] == p["ci"][1] == p["diff"]:
        return f"{p['diff']:+.1f} (same on every item); {p['seeds_ci_excludes_0']}/{k}"
    return (
        f"{p['diff']:+.1f} [{p['ci'][0]:+.1f}, {p['ci'][1]:+.1f}]; {p['seeds_ci_excludes_0']}/{k}"
    )


def _diff(run: dict[str, Any], pair: str, seeds: int) -> str:
    excludes = run["paired"][pair]["seeds_ci_excludes_0"]
    return _pooled_diff({**run["pooled"]["paired"][pair], "seeds_ci_excludes_0": excludes}, seeds)


def _setting(run: dict[str, Any]) -> str:
    return f"N={run['n']} {run['setting'].capitalize()}"


def demo_block(folders: tuple[Path, ...] = (DEMO, DEMO / "n8")) -> str:
    """The demo table of docs/evaluation.md."""
    docs = [_load(f) for f in folders]
    seeds = docs[0]["item_seeds"]
    rows = []
    for doc in docs:
        for run in sorted(doc["runs"], key=lambda r: r["setting"] != "random"):
            cells = [_acc(run, m) for m in METHODS]
            cells += [_diff(run, p, len(doc["item_seeds"])) for p in DEMO_PAIRS]
            rows.append(f"| {_setting(run)} | " + " | ".join(cells) + " |")
    per = docs[0]["runs"][0]
    runs = [run for doc in docs for run in doc["runs"]]
    inside = sum(run["pooled"]["paired"]["agd-attn_pure"]["inside_noise"] for run in runs)
    excluded = sum(run["paired"]["agd-attn_pure"]["seeds_ci_excludes_0"] for run in runs)
    head = "| setting | " + " | ".join(METHODS) + " | agd − vanilla | agd − attn_pure |"
    return "\n".join(
        [
            f"Item seeds {', '.join(map(str, seeds))}, {per['items']} items each (N × "
            "orderings per item, the GT at every position equally often), calibrated on 5 "
            "other items. Accuracy % pooled over every seed's items, with the 95 % "
            "item-bootstrap CI over all of them; differences in points, pooled, with their "
            f"paired CI and on how many of the {len(seeds)} seeds the seed's own paired CI "
            "excludes 0:",
            "",
            head,
            "|:--|" + "--:|" * (len(METHODS) + 2),
            *rows,
            "",
            f"agd − attn_pure: the pooled CI includes 0 in {inside} of {len(runs)} settings, "
            f"and a seed's own CI excludes 0 in {excluded} of {len(runs) * len(seeds)} "
            "(setting, seed) pairs.",
        ]
    )


def simulated_sentence(folder: Path = SIMULATED) -> str:
    """The simulated stages in one sentence per setting."""
    doc = _load(folder)
    k = len(doc["item_seeds"])
    parts = []
    for run in doc["runs"]:
        acc = {m: run["pooled"]["methods"][m]["acc"] for m in ("attn_raw", "attn_pure", "agd")}
        parts.append(
            f"{run['setting'].capitalize()} (N = {run['n']}, item seeds "
            f"{', '.join(map(str, doc['item_seeds']))}, {run['items']} items each, pooled): "
            f"attn_raw {acc['attn_raw']:.1f} < attn_pure {acc['attn_pure']:.1f} < agd "
            f"{acc['agd']:.1f}; attn_pure − attn_raw "
            f"{_diff(run, 'attn_pure-attn_raw', k)}, agd − attn_pure "
            f"{_diff(run, 'agd-attn_pure', k)}, agd − vanilla {_diff(run, 'agd-vanilla', k)} "
            f"(pooled Δ [paired 95% CI]; seeds of {k} whose own CI excludes 0)."
        )
    return "\n".join(parts)


ABLATIONS = (
    ("ablation_no_prior", "no prior (P = 1)", "--no-prior"),
    ("ablation_zero_bias", "B = 0", "--zero-bias"),
    ("ablation_all_layers", "all layers (L* = Λ)", "--all-layers"),
    ("ablation_tau1", "τ = 1 (instead of 5)", "--tau 1"),
)
"""(folder under docs/results/simulated, what it changes, its flag)."""
ABLATION_METHODS = ("vanilla", "attn_raw", "attn_pure", "agd")
ABLATION_PAIRS = ("agd-attn_pure", "agd-vanilla")


def _adversarial(doc: dict[str, Any], key: str = "runs") -> dict[str, Any]:
    return next(r for r in doc[key] if r["setting"] == "adversarial" and r["n"] == 4)


def _ablation_row(label: str, flag: str, run: dict[str, Any], k: int, vs: dict) -> str:
    have = run["pooled"]["methods"]
    cells = [_acc(run, m) if m in have else "–" for m in ABLATION_METHODS]
    cells += [_diff(run, p, k) if p in run["paired"] else "–" for p in ABLATION_PAIRS]
    cells += [_pooled_diff(vs[m], k) if m in vs else "–" for m in ("attn_pure", "agd")]
    return f"| {label} | {flag} | " + " | ".join(cells) + " |"


def ablation_block(folder: Path = SIMULATED) -> str:
    """The ablation table of docs/results/simulated/README.md and one sentence on what each
    flag costs agd against the full method, on the same items and orderings."""
    full = _load(folder)
    k = len(full["item_seeds"])
    rows = [_ablation_row("(none: the full method)", "(none)", _adversarial(full), k, {})]
    costs = []
    for name, label, flag in ABLATIONS:
        doc = _load(folder / name)
        if doc["item_seeds"] != full["item_seeds"] or doc["versus"]["folder"] != "..":
            raise ValueError(f"{name}: not paired with the full run's item seeds")
        vs = _adversarial(doc["versus"])["paired"]
        rows.append(f"{_ablation_row(label, f'`{flag}`', _adversarial(doc), k, vs)}")
        agd, noise = vs["agd"], "includes" if vs["agd"]["inside_noise"] else "excludes"
        costs.append(
            f"{label} {agd['diff']:+.1f} (pooled CI {noise} 0; the CI of "
            f"{agd['seeds_ci_excludes_0']} of {k} seeds excludes 0)"
        )
    head = "| ablation | flag | " + " | ".join(ABLATION_METHODS)
    head += " | agd − attn_pure | agd − vanilla | attn_pure − full | agd − full |"
    return "\n".join(
        [
            f"Item seeds {', '.join(map(str, full['item_seeds']))} (the main run's), "
            f"{_adversarial(full)['items']} items each, Adversarial N = 4. Accuracy % pooled "
            "[95 % item-bootstrap CI]; differences in points, pooled [paired CI]; then on how "
            f"many of the {k} seeds the seed's own paired CI excludes 0. The last two columns "
            "pair the ablated method with the same method of the full run, item for item:",
            "",
            head,
            "|:--|:--|" + "--:|" * (len(ABLATION_METHODS) + 4),
            *rows,
            "",
            "Against the full method, agd: " + "; ".join(costs) + ".",
        ]
    )


ONLINE = ROOT / "docs" / "results" / "online"
STREAMS = (("", "N = 4, feedback 30 %"), ("n8", "`-n 8`"), ("rate10", "`--feedback-rate 0.1`"))
"""(folder under docs/results/online, what it changes)."""


def online_block(folder: Path = ONLINE) -> str:
    """The online-calibration table of docs/results/README.md, from each stream.json. One
    stream per row (one ordering and feedback seed): a single run, said so in the block."""
    rows, above = [], 0
    for name, change in STREAMS:
        doc = json.loads((folder / name / "stream.json").read_text())
        s, acc = doc["summary"], doc["summary"]["acc"]
        above += s["recovered_share_ci"][0] > 0.5
        rows.append(
            f"| `online/{name + '/' if name else ''}` | {change} | {acc['vanilla']:.1f} | "
            f"{acc['drifted']:.1f} | {acc['online']:.1f} | {acc['right']:.1f} | "
            f"{s['gap_points']:+.1f} [{s['gap_ci'][0]:.1f}, {s['gap_ci'][1]:.1f}] | "
            f"{s['recovered_share']:.2f} [{s['recovered_share_ci'][0]:.2f}, "
            f"{s['recovered_share_ci'][1]:.2f}] |"
        )
    return "\n".join(
        [
            f"Accuracy % over the last {s['tail_requests']} requests of each stream (vanilla; "
            "agd with the drifted profile, with it refreshed online, with a profile calibrated "
            "on the right prompt); gap = right − drifted in points and the share of it the "
            "online profile recovered, with request-bootstrap 95 % CIs. **One stream each** "
            "(one seed of orderings and feedback): single runs, not pooled over seeds.",
            "",
            "| folder | change | vanilla | drifted | online | right | gap (points) "
            "| recovered share [95% CI] |",
            "|:--|:--|--:|--:|--:|--:|--:|--:|",
            *rows,
            "",
            f"The lower end of the recovered share's CI is above one half in {above} of "
            f"{len(STREAMS)} streams.",
        ]
    )


BLOCKS: dict[str, tuple[Path, Callable[[], str]]] = {
    "demo": (ROOT / "docs" / "evaluation.md", demo_block),
    "simulated": (ROOT / "docs" / "evaluation.md", simulated_sentence),
    "simulated-readme": (SIMULATED / "README.md", simulated_sentence),
    "ablations": (SIMULATED / "README.md", ablation_block),
    "online": (ROOT / "docs" / "results" / "README.md", online_block),
}
"""marker name -> (page, generator)."""


def markers(name: str) -> tuple[str, str]:
    return (
        f"<!-- claims:{name}:start (generated by `python -m lad_lab.eval.claims`) -->",
        f"<!-- claims:{name}:end -->",
    )


def rewrite(text: str, name: str, body: str) -> str:
    """``text`` with the block ``name`` replaced by ``body`` (ValueError: no markers)."""
    start, end = markers(name)
    if start not in text or end not in text:
        raise ValueError(f"no {start} ... {end} block")
    head, _, rest = text.partition(start)
    _, _, tail = rest.partition(end)
    return f"{head}{start}\n{body}\n{end}{tail}"


def main(argv: list[str] | None = None) -> int:
    check = "--check" in (sys.argv[1:] if argv is None else argv)
    stale = []
    for name, (page, make) in BLOCKS.items():
        text = page.read_text()
        new = rewrite(text, name, make())
        if new != text:
            stale.append(f"{page.relative_to(ROOT)}: block {name}")
            if not check:
                page.write_text(new)
    if check and stale:
        print("stale (run python -m lad_lab.eval.claims): " + "; ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
