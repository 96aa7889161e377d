"""A real `lad serve` for tests (``lad_lab.bench.live.Served`` with the tests' settings), and a
tiny model saved like a real checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lad_lab.bench.live import Served

ROOT = Path(__file__).resolve().parents[1]


def save_tiny_model(directory: Path, family: str = "qwen2_5_vl") -> Path:
    """A tiny random model of ``family`` saved the way a real checkpoint is."""
    from lad_lab.testing.tiny_models import build_tiny

    model, processor = build_tiny(family)
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory


class LiveService(Served):
    """``lad serve`` as the tests run it: one torch thread, JSON log lines, the source tree
    on the path, the log in ``workdir``."""

    def __init__(self, workdir: Path, env: dict[str, str] | None = None) -> None:
        super().__init__(
            {
                "LAD_TORCH_THREADS": "1",
                "OMP_NUM_THREADS": "1",
                "LAD_LOG_FORMAT": "json",
                "PYTHONPATH": str(ROOT),
                **(env or {}),
            },
            workdir=workdir,
        )

    def log_lines(self) -> list[dict[str, Any]]:
        """The JSON log lines (LAD_LOG_FORMAT=json); other lines are skipped."""
        lines = []
        for line in self.log().splitlines():
            try:
                lines.append(json.loads(line))
            except ValueError:
                continue
        return lines
