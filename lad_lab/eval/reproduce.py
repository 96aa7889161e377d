"""The paper's Table 1 and Table 4 in one command (``scripts/reproduce_paper.sh``).

For each checkpoint given as ``--model KEY=PATH`` (KEY one of ``PAPER_TABLES``, e.g.
``Qwen2.5-VL-3B``; any other key runs without published numbers beside it), ``lad eval
--protocol paper`` on COCO (N = 4, Random and Adversarial) with every method of Table 1
(vanilla, instruction, CoT, PriDe, self-consistency, AGD), perm_avg (Table 8) and the
attention readouts of Table 4 (attn_raw = readout without the prior, attn_pure = with
it, agd = the full method). ``comparison.md``: the paper's Acc / RStd / Cons beside ours
with our 95% item-bootstrap CI and the std over the T orderings (the paper's ± is that).

So that a GPU owner loses no work:

- every checkpoint and input path is checked before anything runs, one line each
  (``lad_lab.eval.preflight``): a missing remote-code permission stops it at once;
- the methods run in stages, cheapest first (``STAGES``: the single-forward methods,
  then perm_avg, then the generations), each stage of each model in its own folder
  ``OUT/KEY/STAGE``; after every stage the model's ``OUT/KEY/comparison.md`` and the
  overall ``OUT/comparison.md`` are rewritten from what has finished;
- a rerun skips every stage whose metrics.json exists for the same command (resume);
- ``--dry-run`` needs no model, no CLIP and no data: it prints each stage's prompt
  forwards and decode steps and a time estimate from ``--ms-per-forward`` and
  ``--ms-per-decode-step`` (assumptions; measure yours with ``--quick``);
- ``--quick``: 100 items and the single-forward stage only, with the CI widths expected.

    scripts/reproduce_paper.sh --model Qwen2.5-VL-3B=/ckpt/Qwen2.5-VL-3B-Instruct \\
        --data annotations/captions_val2014.json --images val2014 \\
        --instances annotations/instances_val2014.json --clip /ckpt/clip-vit-large-patch14 \\
        --out runs/paper
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path
from typing import Any

import numpy as np

from lad_lab.eval.paper import PAPER_TABLES
from lad_lab.eval.report import table

TABLE1 = ("vanilla", "instruction", "cot", "pride", "self_consistency", "agd", "perm_avg")
TABLE4 = ("attn_raw", "attn_pure", "agd")
STAGES: dict[str, tuple[str, ...]] = {
    "single": ("vanilla", "instruction", "pride", "attn_raw", "attn_pure", "agd"),
    "perm_avg": ("perm_avg",),
    "generation": ("cot", "self_consistency"),
}
"""The methods in the order they run: one forward per instance (vanilla and instruction:
two generated tokens), then perm_avg's 16 forwards, then CoT's and SC's long generations."""
assert set(sum(STAGES.values(), ())) == set(TABLE1) | set(TABLE4)
ROWS = {
    "vanilla": "Vanilla",
    "instruction": "Instruction",
    "cot": "CoT",
    "pride": "PriDe",
    "self_consistency": "Self-Consistency",
    "agd": "AGD (ours)",
    "perm_avg": "perm_avg (N x cost)",
    "attn_raw": "Attn readout (no prior)",
    "attn_pure": "Attn readout + prior",
}
QUICK_ITEMS = 100
SETTINGS = ("random", "adversarial")
MS_PER_FORWARD = 150.0
MS_PER_DECODE_STEP = 2.0
"""Assumed costs of the estimate: one instance's prompt forward (4 images at 336 px, a
3-8B model in bf16, batched) and one decode step of one sequence in a batch of 16, on one
H100-class GPU. Not measured here; a --quick run's wall_s gives yours."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="scripts/reproduce_paper.sh",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model",
        action="append",
        required=True,
        metavar="KEY=PATH",
        help="a checkpoint (repeatable); KEY names its column of the paper",
    )
    p.add_argument("--dataset", default="coco", choices=("coco", "flickr"))
    p.add_argument("--data", type=Path, help="captions file (required unless --dry-run)")
    p.add_argument("--images", type=Path, help="image folder (required unless --dry-run)")
    p.add_argument("--instances", type=Path, help="COCO instances JSON (category sets)")
    p.add_argument("--clip", type=Path, help="local CLIP ViT-L/14 folder (unless --dry-run)")
    p.add_argument(
        "--items", type=int, help=f"items per setting (paper: 1000; --quick: {QUICK_ITEMS})"
    )
    p.add_argument("--quick", action="store_true", help="fewer items, single-forward methods only")
    p.add_argument("--dry-run", action="store_true", help="print the cost; run nothing")
    p.add_argument("--ms-per-forward", type=float, default=MS_PER_FORWARD)
    p.add_argument("--ms-per-decode-step", type=float, default=MS_PER_DECODE_STEP)
    p.add_argument("--out", type=Path, default=Path("runs/paper"))
    p.add_argument(
        "extra", nargs=argparse.REMAINDER, help="after --: more `lad eval` flags (e.g. --threads 8)"
    )
    return p


def _items(args: argparse.Namespace) -> int:
    return args.items if args.items is not None else (QUICK_ITEMS if args.quick else 1000)


def stages(args: argparse.Namespace) -> dict[str, tuple[str, ...]]:
    return {"single": STAGES["single"]} if args.quick else dict(STAGES)


def eval_argv(
    args: argparse.Namespace, path: str, out: Path, methods: tuple[str, ...]
) -> list[str]:
    """The ``lad eval`` command of one checkpoint and stage."""
    argv = ["--protocol", "paper", "--model", path, "--dataset", args.dataset]
    argv += ["--data", str(args.data), "--images", str(args.images), "--clip", str(args.clip)]
    argv += ["--setting", *SETTINGS, "-n", "4", "--items", str(_items(args))]
    argv += ["--methods", *methods, "--out", str(out)]
    if args.instances is not None:
        argv += ["--instances", str(args.instances)]
    extra = list(args.extra)
    return argv + (extra[1:] if extra[:1] == ["--"] else extra)


def parse_models(specs: list[str]) -> list[tuple[str, str]]:
    out = []
    for spec in specs:
        key, _, path = spec.partition("=")
        if not key or not path:
            raise SystemExit(f"reproduce_paper.sh: --model wants KEY=PATH, got {spec!r}")
        out.append((key, path))
    return out


def _paper(key: str, setting: str, method: str) -> tuple[float, float, float] | None:
    return PAPER_TABLES.get(key, {}).get(f"{setting}/{method}")


def _num(x: float | None) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1f}"


def comparison(results: dict[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """comparison.md and .json: per checkpoint and setting, the paper's row beside ours."""
    out, doc = ["# The paper's tables beside ours (`--protocol paper`)", ""], {}
    for key, metrics in results.items():
        for run in metrics["runs"]:
            setting = run["setting"]
            rows, cells = [], {}
            methods = [m for m in (*TABLE1, *TABLE4) if m in run["methods"]]
            for m in dict.fromkeys(methods):
                ours = run["methods"][m]
                paper = _paper(key, setting, m)
                spread = float(np.std(ours["acc_by_ordering"], ddof=1))
                cells[m] = {
                    "paper": paper,
                    "acc": ours["acc"],
                    "acc_ci": ours["acc_ci"],
                    "acc_std_over_orderings": spread,
                    "rstd": ours["rstd"],
                    "cons": ours["cons"],
                    "unparseable_pct": ours.get("unparseable_pct"),
                }
                unparsed = ours.get("unparseable_pct")
                rows.append(
                    [
                        ROWS[m] + (f" ({unparsed:.1f} % unparsed: wrong)" if unparsed else ""),
                        _num(paper[0]) if paper else "–",
                        _num(paper[1]) if paper else "–",
                        _num(paper[2]) if paper else "–",
                        f"{ours['acc']:.1f} ± {spread:.1f} [{ours['acc_ci'][0]:.1f}, "
                        f"{ours['acc_ci'][1]:.1f}]",
                        _num(ours["rstd"]),
                        _num(ours["cons"]),
                    ]
                )
            doc[f"{key}/{setting}"] = cells
            out += [
                f"## {key}, N = 4, {setting} ({run['items']} items x {run['orderings']} orderings)",
                "",
                table(
                    [
                        "method",
                        "paper Acc",
                        "paper RStd",
                        "paper Cons",
                        "ours Acc ± std over orderings [95% CI]",
                        "ours RStd",
                        "ours Cons",
                    ],
                    rows,
                ),
                "",
            ]
    out += [
        "Table 4 (paper: LLaVA-OneVision, adversarial) maps to attn_raw, attn_pure and "
        "agd; perm_avg's paper value is Table 8's (accuracy only). The paper calibrates "
        "on its first 5 evaluation items; here they are disjoint (protocol.json, notes).",
        "",
    ]
    return "\n".join(out), doc


def ci_half_width(items: int, p: float = 0.5) -> float:
    """Expected half-width (points) of an accuracy's 95% item-bootstrap CI at ``items``
    items: 1.96 sqrt(p (1 - p) / items), the T orderings of one item counted as one draw
    (an upper bound: they are not fully correlated)."""
    return 100 * 1.96 * math.sqrt(p * (1 - p) / items)


def cost(args: argparse.Namespace, models: int) -> list[str]:
    """The dry run: per stage and setting, prompt forwards and decode steps, and a time."""
    from lad_lab.eval.config import EvalConfig
    from lad_lab.eval.paper import PAPER, random_orders
    from lad_lab.eval.protocol_record import _forwards

    items, lines, hours = _items(args), [], 0.0
    orderings, k = 5, len(random_orders(4, PAPER.perm_avg_orders, 0, 1))
    for stage, methods in stages(args).items():
        config = EvalConfig(protocol="paper", methods=list(methods))
        f = _forwards(config, 4, items * orderings, 5, k)
        if stage != "single":  # calibration runs once per model and setting, in "single"
            f["prompt_forwards"] -= f["calibration"]
        ms = f["prompt_forwards"] * args.ms_per_forward
        ms += f["decode_steps_at_most"] * args.ms_per_decode_step
        hours += ms / 3.6e6 * len(SETTINGS) * models
        lines.append(
            f"{stage:10s} ({', '.join(methods)}): per model and setting "
            f"{f['prompt_forwards']:,} prompt forwards, at most "
            f"{f['decode_steps_at_most']:,} decode steps, ~{ms / 3.6e6:.1f} h"
        )
    lines.append(
        f"total for {models} model(s) x {len(SETTINGS)} settings x {items} items x "
        f"{orderings} orderings: ~{hours:.1f} GPU-hours at {args.ms_per_forward:g} ms per "
        f"prompt forward and {args.ms_per_decode_step:g} ms per decode step (assumed; at "
        "most: generations that stop early cost less)"
    )
    lines.append(
        f"expected 95% CI of an accuracy near 50 %: about ±{ci_half_width(items):.1f} points "
        f"at {items} items (±{ci_half_width(1000):.1f} at the paper's 1,000)"
    )
    return lines


def preflight(args: argparse.Namespace, models: list[tuple[str, str]]) -> list[Any]:
    """Every check, one line each (lad_lab.eval.preflight)."""
    from app.settings import Settings
    from lad_lab.eval.preflight import check_model, check_path

    trust = Settings().trust_remote_code
    checks = [check_model(key, path, trust) for key, path in models]
    for flag, path, kind, required in (
        ("--data", args.data, "file", True),
        ("--images", args.images, "folder", True),
        ("--instances", args.instances, "file", False),
        ("--clip", args.clip, "checkpoint folder", True),
    ):
        check = check_path(flag, path, kind, required)
        if check is not None:
            checks.append(check)
    return checks


def finished(out: Path, argv: list[str]) -> bool:
    """The stage ran to its end with this very command (so a rerun may skip it)."""
    try:
        command = json.loads((out / "protocol.json").read_text())["command"]
    except (OSError, ValueError, KeyError):
        return False
    return (out / "metrics.json").is_file() and command == f"lad eval {shlex.join(argv)}"


def merged(folder: Path) -> dict[str, Any] | None:
    """One model's finished stages as one metrics document (runs by setting)."""
    runs: dict[str, dict[str, Any]] = {}
    for stage in STAGES:
        path = folder / stage / "metrics.json"
        if not path.is_file():
            continue
        for run in json.loads(path.read_text())["runs"]:
            into = runs.setdefault(run["setting"], {**run, "methods": {}})
            into["methods"].update(run["methods"])
    return {"runs": list(runs.values())} if runs else None


def write_comparisons(out: Path, models: list[tuple[str, str]]) -> None:
    """OUT/KEY/comparison.md (.json) of every model with a finished stage, and OUT's of all."""
    results = {}
    for key, _ in models:
        metrics = merged(out / key)
        if metrics is None:
            continue
        results[key] = metrics
        text, doc = comparison({key: metrics})
        (out / key / "comparison.md").write_text(text)
        (out / key / "comparison.json").write_text(json.dumps(doc, indent=1) + "\n")
    if results:
        text, doc = comparison(results)
        (out / "comparison.md").write_text(text)
        (out / "comparison.json").write_text(json.dumps(doc, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    models = parse_models(args.model)
    if args.dry_run:
        print("\n".join(cost(args, len(models))))
        return 0
    checks = preflight(args, models)
    print("\n".join(("ok   " if c.ok else "FAIL ") + c.line for c in checks))
    if not all(c.ok for c in checks):
        print("reproduce_paper.sh: nothing was run; fix the lines marked FAIL", file=sys.stderr)
        return 2
    if args.quick:
        print(f"quick: {_items(args)} items; {cost(args, len(models))[-1]}")
    from lad_lab.eval import cli

    for stage, methods in stages(args).items():
        for key, path in models:
            out = args.out / key / stage
            argv_ = eval_argv(args, path, out, methods)
            if finished(out, argv_):
                print(f"{key} {stage}: finished earlier ({out}), skipped")
                continue
            print(f"{key} {stage}: lad eval {shlex.join(argv_)}")
            code = cli.main(argv_, prog="lad eval")
            if code:
                return code
            write_comparisons(args.out, models)
            print(f"{key} {stage}: done; {args.out / key / 'comparison.md'}")
    write_comparisons(args.out, models)
    print((args.out / "comparison.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
