"""The serving install imports no lab module: the service built on the demo model answers a
retrieve, and `lad serve --help` runs, without lad_lab or matplotlib ever being imported
(a fresh interpreter, so that no other test's imports count).

tqdm is no lab dependency of the service's own: transformers imports it itself
(``transformers.utils.logging``), so it is loaded exactly when transformers' logging is.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

PROBE = """
import io, sys
from PIL import Image
from fastapi.testclient import TestClient
import app.cli, app.serve
from app.main import create_app
from app.settings import Settings

def loaded(*names):
    return sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in names})

LAB = ("lad_lab", "matplotlib")
assert loaded(*LAB, "tqdm") == [], loaded(*LAB, "tqdm")
assert app.cli.main(["serve", "--help"]) == 0

def png(colour):
    out = io.BytesIO()
    Image.new("RGB", (56, 56), colour).save(out, "PNG")
    return out.getvalue()

settings = Settings(_env_file=None, model="demo", store_url="memory://")
with TestClient(create_app(settings)) as client:
    files = [("images", (f"{c}.png", png(c), "image/png")) for c in ("red", "blue", "green")]
    answer = client.post("/v1/retrieve", data={"query": "a red circle", "method": "vanilla"},
                         files=files)
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["probabilities"]) == 3
assert loaded(*LAB) == [], loaded(*LAB)
assert ("tqdm" in sys.modules) == ("transformers.utils.logging" in sys.modules)
print("SERVED WITHOUT THE LAB")
"""


def test_the_service_answers_without_importing_the_lab() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "SERVED WITHOUT THE LAB" in done.stdout
