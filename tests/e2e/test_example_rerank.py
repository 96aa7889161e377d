"""examples/vector_search_rerank.py as written, against a real `lad serve` on the demo model:
faiss over pooled vision-tower features, calibration of every N, then /v1/rerank."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.live import ROOT, LiveService


@pytest.mark.slow
def test_vector_search_then_rerank_example_runs(tmp_path):
    with LiveService(tmp_path) as live:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(
            [
                sys.executable,
                str(ROOT / "examples" / "vector_search_rerank.py"),
                "--url",
                live.url,
                "--calibrate",
                "--gallery",
                "80",
                "--queries",
                "4",
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "indexed 80 images" in done.stdout
    assert "calibrated N = [2, 3, 4, 5, 6, 7, 8]" in done.stdout
    summary = re.search(r"4 queries: recall@16 (\d+) %.* (\d+\.\d) forward passes", done.stdout)
    assert summary is not None, done.stdout
    assert float(summary.group(2)) == 3.0  # 16 candidates, window 8: windows [[8, 8], [2]]
