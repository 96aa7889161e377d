#!/usr/bin/env bash
# The paper's Table 1 and Table 4 under its own protocol, beside its published numbers.
# Checks every checkpoint and path first (one line each; remote-code checkpoints such as
# LLaVA-OneVision-1.5 need LAD_TRUST_REMOTE_CODE=true), runs the cheap methods first,
# writes OUT/KEY/comparison.md after every stage and resumes where it stopped.
#   scripts/reproduce_paper.sh --model Qwen2.5-VL-3B=/ckpt/Qwen2.5-VL-3B-Instruct --dry-run
#       (the cost and a time estimate; needs no model, no CLIP, no data)
#   LAD_TRUST_REMOTE_CODE=true scripts/reproduce_paper.sh \
#     --model Qwen2.5-VL-3B=/ckpt/Qwen2.5-VL-3B-Instruct \
#     --model LLaVA-OneVision-8B=/ckpt/LLaVA-OneVision-1.5-8B-Instruct \
#     --model InternVL3-8B=/ckpt/InternVL3-8B-HF \
#     --data coco/annotations/captions_val2014.json --images coco/val2014 \
#     --instances coco/annotations/instances_val2014.json --clip /ckpt/clip-vit-large-patch14 \
#     --out runs/paper [--quick]
# See `scripts/reproduce_paper.sh --help` and lad_lab/eval/reproduce.py.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${LAD_PYTHON:-$root/.venv/bin/python}"
[ -x "$python" ] || python="$(command -v python3)"
cd "$root"
exec "$python" -m lad_lab.eval.reproduce "$@"
