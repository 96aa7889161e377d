"""``scripts/reproduce_paper.sh`` end to end on the demo model and a small COCO-format set
made in code (a tiny random CLIP for the adversarial negatives): Table 1's methods and
Table 4's readouts under the paper's protocol, the paper's numbers beside ours."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.eval.fixtures import tiny_clip, write_coco

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_reproduce_script_on_the_demo_model(tmp_path) -> None:
    captions, images, instances = write_coco(tmp_path / "coco", count=30)
    clip = tiny_clip(tmp_path / "clip")
    out = tmp_path / "paper"
    command = [
        str(ROOT / "scripts" / "reproduce_paper.sh"),
        "--model",
        "Qwen2.5-VL-3B=demo",
        "--data",
        str(captions),
        "--images",
        str(images),
        "--instances",
        str(instances),
        "--clip",
        str(clip),
        "--items",
        "2",
        "--out",
        str(out),
        "--",
        "--calibration",
        "1",
        "--orderings",
        "2",
        "--cot-max-new-tokens",
        "3",
        "--sc-max-new-tokens",
        "3",
        "--samples",
        "2",
        "--bootstrap",
        "100",
        "--quiet",
        "--cache-dir",
        str(tmp_path / "cache"),
    ]
    env = {**os.environ, "LAD_PYTHON": sys.executable}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    text = (out / "comparison.md").read_text()
    assert "Qwen2.5-VL-3B, N = 4, random" in text and "adversarial" in text
    assert "| Vanilla | 51.7 | 36.3 | 6.6 |" in text  # the paper's row, beside ours
    assert "Attn readout + prior" in text and "Self-Consistency" in text
    doc = json.loads((out / "comparison.json").read_text())
    assert set(doc) == {"Qwen2.5-VL-3B/random", "Qwen2.5-VL-3B/adversarial"}
    protocol = json.loads((out / "Qwen2.5-VL-3B" / "protocol.json").read_text())
    assert protocol["protocol"] == "paper" and len(protocol["runs"]) == 2
    assert {"cot", "self_consistency", "perm_avg", "attn_raw"} <= set(protocol["methods"])
