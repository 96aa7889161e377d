"""`pip install ./clients/python` alone: a fresh virtual environment (no system site
packages) gets lad-client and its two dependencies (httpx, pydantic; Pillow is the
``pillow`` extra), and no torch, transformers, matplotlib or service code.

pip installs from the machine's configured package index (and its local wheel folders,
``pip config list`` shows them); the test needs them reachable.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "clients" / "python"

# Runs inside the fresh environment: the client's answers are parsed from a real HTTP
# exchange (httpx's mock transport), then nothing heavy may have been imported.
PROBE = r"""
import importlib.metadata as md, json, sys
import httpx
import lad_client
from lad_client import LadClient, LadError
from lad_client.types import RETRIEVE_EXAMPLE, MAX_CALIBRATION_EXAMPLES

def answer(request):
    body = json.loads(request.content)
    if body["query"] == "fail":
        return httpx.Response(409, json={"error": {"code": "calibration_required",
                              "message": "calibrate first", "request_id": "r1"}})
    n = len(body["images"])
    return httpx.Response(200, json={
        "index": 1, "ranking": [1, 0, 2][:n], "label": "2", "probabilities": [0.2, 0.7, 0.1],
        "raw_probabilities": [0.3, 0.4, 0.3], "method": body["method"], "debiased": False,
        "model": "m", "timings_ms": {"forward": 1.0}, "request_id": "r0"})

http = httpx.Client(base_url="http://lad", transport=httpx.MockTransport(answer))
lad = LadClient(http=http, retries=0)
got = lad.retrieve("q", [b"a", b"b", b"c"], method="vanilla")
try:
    lad.retrieve("fail", [b"a", b"b"])
    raise SystemExit("no LadError")
except LadError as error:
    code = error.code
heavy = ("torch", "transformers", "matplotlib", "numpy", "fastapi", "app", "calibration_store")
dists = {d.metadata["Name"].lower() for d in md.distributions()}
print(json.dumps({
    "index": got.index, "code": code, "loaded": sorted(m for m in heavy if m in sys.modules),
    "dists": sorted(dists), "max": MAX_CALIBRATION_EXAMPLES,
    "file": sys.modules["lad_client"].__file__,
    "version": [lad_client.__version__, md.version("lad-client")],
}))
"""


@pytest.mark.slow
def test_the_client_installs_alone_into_a_fresh_venv(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    python = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    source = tmp_path / "src"  # a copy: the build writes build/ and *.egg-info beside it
    shutil.copytree(
        CLIENT, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(source)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    probe = subprocess.run(
        [str(python), "-c", PROBE],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    assert found["index"] == 1 and found["code"] == "calibration_required"
    assert found["max"] == 64
    assert found["loaded"] == []
    assert Path(found["file"]).is_relative_to(env_dir)  # the installed copy, not the checkout
    assert {"lad-client", "httpx", "pydantic"} <= set(found["dists"])
    unwanted = {"torch", "transformers", "matplotlib", "lad-serve", "numpy", "pillow"}
    assert not unwanted & set(found["dists"])  # bytes were sent: no Pillow needed
    assert found["version"][0] == found["version"][1]  # pyproject reads lad_client.__version__
