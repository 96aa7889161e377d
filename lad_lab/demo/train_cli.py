"""``lad demo train``'s options, apart from the training code so that --help imports no torch."""

from __future__ import annotations

import argparse
from pathlib import Path

from app.cli_help import command_parser
from app.models.demo_model import DEMO_MODEL_DIR

DEFAULT_OUT = DEMO_MODEL_DIR


def build_parser() -> argparse.ArgumentParser:
    ap = command_parser(
        prog="lad demo train",
        description="Train the bundled demo MLLM on the synthetic world, on CPU "
        "(lad_lab/demo/train.py says how). Prints the losses every --log-every steps.",
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output model directory")
    ap.add_argument("--steps", type=int, default=8000, help="total optimiser steps")
    ap.add_argument(
        "--caption-fraction",
        type=float,
        default=0.15,
        help="share of the steps spent on stage 1 (captioning)",
    )
    ap.add_argument("--batch-size", type=int, default=16, help="examples per step")
    ap.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    ap.add_argument(
        "--aux-weight",
        type=float,
        default=1.0,
        help="weight of the attention-mass loss (0 disables it)",
    )
    ap.add_argument(
        "--corruption", type=float, default=1.0, help="scale of the label corruption Q (0: none)"
    )
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--seed", type=int, default=0, help="seed of data and initialisation")
    ap.add_argument(
        "--init-from",
        type=Path,
        default=None,
        help="fine-tune this saved demo model instead of starting from scratch",
    )
    ap.add_argument("--device", default="cpu", help="torch device to train on (cpu, cuda)")
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="stop early (and save) after this many seconds; the log says so",
    )
    ap.add_argument(
        "--schemes",
        nargs="+",
        default=["digits"],
        choices=["digits", "upper", "lower", "roman", "words"],
        help="label schemes, one drawn per retrieval batch",
    )
    ap.add_argument(
        "--corruption-shape",
        choices=["edges", "neighbours"],
        default="edges",
        help="shape of Q: v1's edges-only, or v2's neighbours-and-edges",
    )
    ap.add_argument(
        "--prior-mix",
        type=float,
        default=0.0,
        help="share of the primacy/recency prior in the attention target",
    )
    ap.add_argument(
        "--target-shape",
        choices=["mix", "product"],
        default="mix",
        help="how the prior skews the attention target: additive or multiplicative",
    )
    ap.add_argument(
        "--aux-layers",
        type=int,
        nargs="+",
        default=None,
        help="decoder layers of the attention loss (default: Λ)",
    )
    ap.add_argument(
        "--caption-share",
        type=float,
        default=0.1,
        help="share of captioning batches during stage 2",
    )
    ap.add_argument(
        "--curriculum-start",
        type=float,
        default=0.0,
        help="start the N/hard-negative curriculum at this point in [0, 1]",
    )
    ap.add_argument("--log-every", type=int, default=50, help="steps between progress lines")
    return ap


def main(argv: list[str] | None = None) -> int:
    """CLI entry point of ``lad demo train``: parse, then load torch and train."""
    args = build_parser().parse_args(argv)
    from lad_lab.demo.train import run

    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
