"""Where the bundled demo model lives: package data of ``app.models`` (``app/models/demo/``:
weights, config, tokenizer, chat template, README, training log), found through
``importlib.resources`` so that it is wherever the package is installed, the wheel included.
Torch-free, so that ``lad demo train --help`` can show it as the default output."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

DEMO_MODEL_DIR = Path(str(resources.files("app.models") / "demo"))
"""The demo model's directory (``LAD_MODEL=demo``; ``lad demo train`` writes here by default)."""
