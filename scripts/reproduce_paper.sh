#!/usr/bin/env bash
# The paper's Table 1 and Table 4 under its own protocol, beside its published numbers.
# Needs the checkpoints, COCO val2017 (captions + instances JSON, images) and a local
# CLIP ViT-L/14 directory on disk; see `scripts/reproduce_paper.sh --help` and
# app/eval/reproduce.py. Example:
#   scripts/reproduce_paper.sh --model Qwen2.5-VL-3B=/ckpt/Qwen2.5-VL-3B-Instruct \
#     --model LLaVA-OneVision-8B=/ckpt/LLaVA-OneVision-1.5-8B-Instruct \
#     --model InternVL3-8B=/ckpt/InternVL3-8B-HF \
#     --data coco/annotations/captions_val2017.json --images coco/val2017 \
#     --instances coco/annotations/instances_val2017.json --clip /ckpt/clip-vit-large-patch14 \
#     --out runs/paper
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${LAD_PYTHON:-$root/.venv/bin/python}"
[ -x "$python" ] || python="$(command -v python3)"
cd "$root"
exec "$python" -m app.eval.reproduce "$@"
