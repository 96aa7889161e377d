"""Where benchmark results go: one JSON record per run, under bench/results/ by default."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_record(path: str | Path, record: dict[str, Any]) -> Path:
    """Write ``record`` as indented JSON (parent folders created) and say where."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2))
    print(f"wrote {out}")
    return out
