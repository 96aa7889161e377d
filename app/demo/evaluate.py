"""``lad demo eval``: the demo model card's numbers, in one command.

Calibrates on ``--calibration-items`` items of the synthetic world's calibration split (all
N rotations each, DESIGN §2.3), then scores ``--items`` held-out items of the eval split
under T = 5 orderings each (DESIGN §2.7) with every method of §2.4–§2.5:

    vanilla      argmax s
    pride        argmax (s − g), g the column mean of B
    attn_raw     argmax ā (attention over L*, no prior)
    attn_pure    argmax π (purified attention posterior)
    agd          argmax (s − β), defaults: "reference" readout, "linear" mixture
    agd_logmean  agd with the paper-equation readout (variant "logmean")
    agd_log      agd with the log-mixture β (mixture "log")
    perm_avg     mean of s over the N cyclic rotations of each ordering, by image identity

Every method but perm_avg reuses the same forward outputs; perm_avg adds N-1 rotations per
(item, ordering). Prints a table (Acc mean ± std over orderings, RStd, Cons) and writes a
JSON report (one run: the report itself; several ``--n``/``--setting`` values: one run
per combination, ``{"command": ..., "runs": [...]}``). Examples::

    lad demo eval --model demo --n 4 --setting random --items 200
    lad demo eval --n 4 8 --setting random adversarial     # the model card's four tables

``--seed`` seeds the per-item orderings; items are always 0..items-1 of the eval split.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from app.demo import world
from app.engine import debias
from app.engine.calibrate import Calibration, calibration_instances, estimate_calibration
from app.engine.methods import METHODS, MULTI_PASS, MethodConfig, apply_method
from app.eval.metrics import MethodResult, evaluate_predictions
from app.eval.protocol import T_ORDERINGS, apply_ordering, item_orderings
from app.eval.report import confusion_table, results_table

ROWS = (
    "vanilla",
    "pride",
    "attn_raw",
    "attn_pure",
    "agd",
    "agd_logmean",
    "agd_log",
    "perm_avg",
)
"""The table's rows: every method, plus agd under the other two §2.4 variants."""

Progress = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def forward_batched(
    runner: Any,
    instances: Sequence[tuple[str, Sequence[Any]]],
    *,
    labels: str | Sequence[str] = "digits",
    batch_size: int = 16,
    progress: Progress | None = None,
    timings: dict[str, float] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Scores (R, N) and attention (R, |Λ|, N) of R (query, images) instances, in batches."""
    from app.engine.interface import RetrievalItem

    scores: list[np.ndarray] = []
    attention: list[np.ndarray] = []
    began, reported = time.perf_counter(), 0
    for start in range(0, len(instances), batch_size):
        chunk = [
            RetrievalItem(q, list(images)) for q, images in instances[start : start + batch_size]
        ]
        out = runner.forward(chunk, labels)
        scores.extend(out.scores)
        attention.extend(out.attention)
        if timings is not None:
            for key, value in out.timings_ms.items():
                timings[key] = timings.get(key, 0.0) + float(value)
        done = min(start + batch_size, len(instances))
        if progress is not None and (
            done - reported >= len(instances) / 10 or done == len(instances)
        ):
            reported = done
            rate = done / max(time.perf_counter() - began, 1e-9)
            progress(f"  {done}/{len(instances)} instances ({rate:.1f}/s)")
    return np.stack(scores), np.stack(attention)


def calibrate(
    runner: Any,
    examples: Sequence[world.RetrievalExample],
    *,
    labels: str | Sequence[str] = "digits",
    batch_size: int = 16,
    progress: Progress | None = None,
    timings: dict[str, float] | None = None,
) -> Calibration:
    """DESIGN §2.3: every example under all N rotations, then B and P."""
    instances, gt = calibration_instances([(ex.query, ex.images, ex.target) for ex in examples])
    scores, attention = forward_batched(
        runner, instances, labels=labels, batch_size=batch_size, progress=progress, timings=timings
    )
    return estimate_calibration(scores, attention, gt)


def method_scores(
    scores: np.ndarray,
    attention: np.ndarray,
    calibration: Calibration,
    *,
    top_k: int = 2,
    tau: float = 5.0,
) -> dict[str, np.ndarray]:
    """Per-position probabilities (B, N) of every single-pass row; the prediction is the argmax."""
    base = MethodConfig(top_k=top_k, tau=tau)
    rows = {m: (m, base) for m in METHODS if m not in MULTI_PASS}
    rows["agd_logmean"] = ("agd", replace(base, posterior_variant="logmean"))
    rows["agd_log"] = ("agd", replace(base, mixture="log"))
    return {
        row: apply_method(method, scores, attention, calibration, config).probabilities
        for row, (method, config) in rows.items()
    }


def perm_avg_scores(
    runner: Any,
    examples: Sequence[world.RetrievalExample],
    orderings: np.ndarray,
    base_scores: np.ndarray,
    *,
    labels: str | Sequence[str] = "digits",
    batch_size: int = 16,
    progress: Progress | None = None,
    timings: dict[str, float] | None = None,
) -> np.ndarray:
    """(I, T, N) perm_avg probabilities per position of each ordering (rotation 0 =
    ``base_scores``)."""
    n_items, t, n = orderings.shape
    instances = [
        (ex.query, debias.rotate(apply_ordering(ex.images, orderings[i, o]), shift))
        for i, ex in enumerate(examples)
        for o in range(t)
        for shift in range(1, n)
    ]
    rotated = np.zeros((n_items, t, n, n))
    rotated[:, :, 0] = base_scores
    if n > 1:
        extra, _ = forward_batched(
            runner, instances, labels=labels, batch_size=batch_size, progress=progress,
            timings=timings,
        )  # fmt: skip
        rotated[:, :, 1:] = extra.reshape(n_items, t, n - 1, n)
    flat = rotated.reshape(n_items * t, n, n)
    averaged = apply_method("perm_avg", flat[:, 0], None, rotated_scores=flat).probabilities
    return averaged.reshape(n_items, t, n)


def predict(
    runner: Any,
    examples: Sequence[world.RetrievalExample],
    orderings: np.ndarray,
    calibration: Calibration,
    *,
    labels: str | Sequence[str],
    batch_size: int,
    top_k: int,
    tau: float,
    perm_avg: bool,
    progress: Progress | None,
    timings: dict[str, float],
) -> dict[str, np.ndarray]:
    """Predicted positions (I, T) of every row under each item's orderings."""
    say = progress or (lambda _msg: None)
    items, n_orderings, n = orderings.shape
    instances = [
        (ex.query, apply_ordering(ex.images, orderings[i, o]))
        for i, ex in enumerate(examples)
        for o in range(n_orderings)
    ]
    flat_scores, flat_attention = forward_batched(
        runner, instances, labels=labels, batch_size=batch_size, progress=progress,
        timings=timings,
    )  # fmt: skip
    per_method = method_scores(flat_scores, flat_attention, calibration, top_k=top_k, tau=tau)
    predictions = {
        name: np.argmax(s, axis=-1).reshape(items, n_orderings) for name, s in per_method.items()
    }
    if perm_avg:
        say(f"perm_avg: {items} items x {n_orderings} orderings x {n - 1} extra rotations")
        averaged = perm_avg_scores(
            runner, examples, orderings, flat_scores.reshape(items, n_orderings, n),
            labels=labels, batch_size=batch_size, progress=progress, timings=timings,
        )  # fmt: skip
        predictions["perm_avg"] = np.argmax(averaged, axis=-1)

    return predictions


def run_eval(
    runner: Any,
    *,
    n: int = 4,
    setting: str = "random",
    items: int = 200,
    calibration_items: int = 5,
    seed: int = 0,
    image_size: int | None = None,
    labels: str | Sequence[str] = "digits",
    batch_size: int = 16,
    n_orderings: int = T_ORDERINGS,
    top_k: int = 2,
    tau: float = 5.0,
    perm_avg: bool = True,
    progress: Progress | None = None,
) -> tuple[list[MethodResult], dict[str, Any]]:
    """Calibrate, evaluate every method, return the results and a JSON-ready report."""
    say = progress or (lambda _msg: None)
    image_size = image_size or image_size_for(runner)
    timings: dict[str, float] = {}
    started = time.perf_counter()

    calibration_examples = world.make_items(
        calibration_items, n, setting, seed="calibration", image_size=image_size
    )
    say(f"calibration: {calibration_items} items x {n} rotations")
    calibration = calibrate(
        runner, calibration_examples, labels=labels, batch_size=batch_size, progress=progress,
        timings=timings,
    )  # fmt: skip

    examples = world.make_items(items, n, setting, seed="eval", image_size=image_size)
    orderings = item_orderings(n, items, n_orderings, seed=seed)
    say(f"evaluation: {items} items x {n_orderings} orderings")
    predictions = predict(
        runner, examples, orderings, calibration, labels=labels, batch_size=batch_size,
        top_k=top_k, tau=tau, perm_avg=perm_avg, progress=progress, timings=timings,
    )  # fmt: skip
    targets = np.array([ex.target for ex in examples])
    results = [
        evaluate_predictions(name, predictions[name], targets, orderings)
        for name in ROWS
        if name in predictions
    ]
    for r in results:  # the cost: prompt forwards per scored instance
        r.extra["forwards_per_instance"] = n if r.method == "perm_avg" else 1
    config = {
        "n": n, "setting": setting, "items": items, "calibration_items": calibration_items,
        "orderings": n_orderings, "seed": seed, "image_size": image_size,
        "labels": labels if isinstance(labels, str) else list(labels), "top_k": top_k,
        "tau": tau, "eval_split": "eval", "calibration_split": "calibration",
        "calibration_setting": setting,
    }  # fmt: skip
    report = {
        "config": config,
        "model": runner.fingerprint(labels, n).model_dump(),
        "layers": [int(x) for x in getattr(runner, "layers", ())],
        "calibration": {
            "bias_matrix": calibration.bias_matrix.tolist(),
            "attention_prior": calibration.attention_prior.tolist(),
            "examples": calibration_items,
        },
        "methods": {r.method: r.to_dict() for r in results},
        "table": results_table(results),
        "timings_ms": {**timings, "total": (time.perf_counter() - started) * 1e3},
    }
    return results, report


def image_size_for(runner: Any) -> int:
    """The side the model's processor resizes every image to, when it pins one (demo, tiny).

    Qwen-style processors store min/max pixels as ``size.shortest_edge``/``longest_edge``;
    equal values mean a fixed side**2 pixels, so the world renders at exactly that side.
    """
    size = getattr(
        getattr(getattr(runner, "processor", None), "image_processor", None), "size", None
    )
    low = getattr(size, "shortest_edge", None) if size is not None else None
    high = getattr(size, "longest_edge", None) if size is not None else None
    if isinstance(low, int) and low == high and low > 0:
        side = round(low**0.5)
        if side * side == low:
            return side
    return world.DEFAULT_IMAGE_SIZE


def _default_out(model: str, runs: Sequence[tuple[str, int]]) -> Path:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(model).name or model)
    suffix = f"_{runs[0][0]}_n{runs[0][1]}" if len(runs) == 1 else ""
    return Path("bench/results") / f"demo_eval_{name}{suffix}.json"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lad demo eval", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo", help='"demo", a hub name or a local path')
    parser.add_argument(
        "--n", type=int, nargs="+", default=[4], help="candidates per item (several: one run each)"
    )
    parser.add_argument(
        "--setting", choices=world.SETTINGS, nargs="+", default=["random"], help="one run each"
    )
    parser.add_argument("--items", type=int, default=200, help="held-out evaluation items")
    parser.add_argument("--calibration-items", type=int, default=5, help="M, calibration items")
    parser.add_argument("--seed", type=int, default=0, help="seed of the per-item orderings")
    parser.add_argument("--orderings", type=int, default=T_ORDERINGS, help="T orderings per item")
    parser.add_argument(
        "--image-size", type=int, default=None, help="world image side (default: the processor's)"
    )
    parser.add_argument("--labels", default="digits", help="label scheme")
    parser.add_argument("--batch-size", type=int, default=16, help="instances per forward")
    parser.add_argument("--top-k", type=int, default=2, help="K, layers in L*")
    parser.add_argument("--tau", type=float, default=5.0, help="posterior sharpening")
    parser.add_argument("--no-perm-avg", action="store_true", help="skip the N-pass baseline")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--out", type=Path, default=None, help="JSON report path")
    parser.add_argument("--confusion", action="store_true", help="also print confusion tables")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the evaluation; print the table; write the JSON report."""
    args = build_parser().parse_args(argv)
    import torch

    from app.models.loader import load_runner

    torch.set_num_threads(args.threads)
    progress = None if args.quiet else _stderr
    runner = load_runner(args.model, threads=args.threads)
    command = "lad demo eval " + " ".join(argv if argv is not None else sys.argv[1:])
    runs = [(setting, n) for setting in args.setting for n in args.n]
    reports = []
    for setting, n in runs:
        results, report = run_eval(
            runner,
            n=n,
            setting=setting,
            items=args.items,
            calibration_items=args.calibration_items,
            seed=args.seed,
            image_size=args.image_size,
            labels=args.labels,
            batch_size=args.batch_size,
            n_orderings=args.orderings,
            top_k=args.top_k,
            tau=args.tau,
            perm_avg=not args.no_perm_avg,
            progress=progress,
        )
        report["command"] = command
        report["config"]["model"] = args.model
        reports.append(report)
        c = report["config"]
        print(f"\n{args.model}: N={n} {setting}, {c['items']} items x {c['orderings']} "
              f"orderings, M={c['calibration_items']} calibration items")  # fmt: skip
        print(results_table(results))
        if args.confusion:
            for r in results:
                print(f"\n{r.method}: GT position x predicted position (%)")
                print(confusion_table(r))
    out = args.out or _default_out(args.model, runs)
    out.parent.mkdir(parents=True, exist_ok=True)
    document = reports[0] if len(reports) == 1 else {"command": command, "runs": reports}
    out.write_text(json.dumps(document, indent=2) + "\n")
    total = sum(r["timings_ms"]["total"] for r in reports) / 1e3
    print(f"\nreport: {out}  ({total:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
