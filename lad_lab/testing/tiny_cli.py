"""``lad model tiny <model_type> <dir>``: a tiny random checkpoint of any served model type.

The directory holds what a real checkpoint holds (config.json, safetensors weights, the
processor with its tokenizer and chat template), built in code by
``lad_lab.testing.tiny_models.build_tiny``, so ``LAD_MODEL=<dir> lad serve`` runs the service
on that model type without downloading weights. Random weights: the answers mean nothing;
the layout, spans, scores and capture are the real family's.
"""

from __future__ import annotations

import sys
from pathlib import Path

from app.cli_help import command_parser


def main(argv: list[str] | None = None) -> int:
    parser = command_parser(prog="lad model tiny", description=__doc__)
    parser.add_argument("model_type", help="a model type of transformers (e.g. llava, gemma3)")
    parser.add_argument("dir", type=Path, help="directory to write (created)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    args = parser.parse_args(argv)
    from app.models.loader import quiet_progress_bars
    from lad_lab.testing.tiny_models import TinyBuildError, build_tiny

    try:
        model, processor = build_tiny(args.model_type, seed=args.seed)
    except (TinyBuildError, ImportError) as exc:  # ImportError: the Qwen vocabularies' extra
        print(f"lad model tiny: {exc}".splitlines()[0], file=sys.stderr)
        return 1
    quiet_progress_bars()
    args.dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.dir)
    processor.save_pretrained(args.dir)
    millions = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"wrote a tiny random {args.model_type} ({millions:.1f} M parameters) to {args.dir}")
    print(f"  serve it: LAD_MODEL={args.dir} lad serve")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
