"""``lad bench dtype``: do the decisions in bfloat16 agree with float32?

``LAD_DTYPE=auto`` serves a bfloat16 checkpoint in bfloat16 where the device multiplies it
natively (CUDA; CPUs with AVX-512 BF16 or AMX), 2.8x float32 on this project's CPU. This
measures what that costs in decisions, per model (the demo and the tiny families): each
dtype calibrated on the same examples (a profile is fingerprinted by dtype, so a dtype
change means a recalibration), then the same test items answered by vanilla and agd in
both; the agreement of the argmax and the largest |Δp| of the probabilities.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from app.cli_help import command_parser
from lad_lab.bench.results import device_name, write_record

DTYPES = ("float32", "bfloat16")
METHODS = ("vanilla", "agd")


def compare(probs: dict[str, dict[str, np.ndarray]]) -> dict[str, Any]:
    """Per method: argmax agreement of bfloat16 with float32 and the largest |Δp|."""
    out: dict[str, Any] = {}
    for method in METHODS:
        a, b = probs["float32"][method], probs["bfloat16"][method]
        out[method] = {
            "agree": int((a.argmax(-1) == b.argmax(-1)).sum()),
            "items": int(a.shape[0]),
            "max_abs_dp": float(np.abs(a - b).max()),
        }
    return out


def _runner(model: str, dtype: str, threads: int):
    import torch

    if model == "demo":
        from app.models.loader import load_runner

        return load_runner("demo", device="cpu", dtype=dtype, threads=threads)
    from lad_lab.testing.tiny_models import tiny_runner

    runner = tiny_runner(model.removeprefix("tiny-"))
    runner.model.to(dtype=getattr(torch, dtype))
    return runner


def _forward(runner, items: list[tuple[str, list]], batch: int) -> tuple[np.ndarray, np.ndarray]:
    from app.engine.interface import RetrievalItem

    scores, attention = [], []
    for start in range(0, len(items), batch):
        chunk = [RetrievalItem(q, imgs) for q, imgs in items[start : start + batch]]
        out = runner.forward(chunk, "digits")
        scores += out.scores
        attention += out.attention
    return np.stack(scores), np.stack(attention)


def decisions(model: str, dtype: str, n: int, items: int, threads: int, side: int) -> dict:
    """vanilla and agd probabilities (items, N) of ``model`` in ``dtype``."""
    from app.method.calibrate import calibration_instances, estimate_calibration
    from app.method.methods import apply_method
    from lad_lab.demo.world import make_items

    runner = _runner(model, dtype, threads)
    examples = make_items(5, n_candidates=n, seed="calibration", image_size=side)
    instances, gt = calibration_instances([(e.query, e.images, e.target) for e in examples])
    s, a = _forward(runner, instances, 4)
    calibration = estimate_calibration(s, a, gt)
    tests = make_items(items, n_candidates=n, seed="eval", image_size=side)
    s, a = _forward(runner, [(e.query, e.images) for e in tests], 4)
    return {m: apply_method(m, s, a, calibration).probabilities for m in METHODS}


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | items | vanilla argmax agree | agd argmax agree | vanilla max abs Δp "
        "| agd max abs Δp |",
        "|:--|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        v, g = r["vanilla"], r["agd"]
        lines.append(
            f"| {r['model']} | {v['items']} | {v['agree']}/{v['items']} | "
            f"{g['agree']}/{g['items']} | {v['max_abs_dp']:.3f} | {g['max_abs_dp']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = command_parser(prog="lad bench dtype", description=__doc__)
    parser.add_argument(
        "--models",
        default="demo,tiny-qwen2_5_vl,tiny-qwen2_vl,tiny-internvl",
        help="demo and tiny-<family>, comma-separated",
    )
    parser.add_argument("--n", type=int, default=4, help="images per item")
    parser.add_argument("--items", type=int, default=64, help="test items per model")
    parser.add_argument("--side", type=int, default=224, help="image side in pixels")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="bench/results/dtype.json")
    args = parser.parse_args(argv)
    load_start = os.getloadavg()[0]
    rows = []
    for model in args.models.split(","):
        probs = {
            d: decisions(model, d, args.n, args.items, args.threads, args.side) for d in DTYPES
        }
        row = {"model": model, **compare(probs)}
        print(row, flush=True)
        rows.append(row)
    record = {
        "command": "lad bench dtype " + " ".join(argv or []),
        "model": args.models.replace(",", ", "),
        "device": "cpu",
        "device_name": device_name("cpu"),
        "load_avg_1min": {"start": load_start, "end": os.getloadavg()[0]},
        "n_images": args.n,
        "rows": rows,
    }
    record["table"] = render(rows)
    print(record["table"])
    write_record(args.out, record)
    return 0
