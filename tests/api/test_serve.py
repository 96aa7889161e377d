"""`lad serve` for real: uvicorn in a subprocess, a tiny model saved to disk, plain HTTP."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from app.testing.tiny_models import build_tiny
from tests.api.helpers import retrieve_body

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_lad_serve_runs_uvicorn_with_the_settings(tmp_path, items, calibrate_json):
    model_dir = tmp_path / "tiny-model"
    # the byte-level vocabulary: this test is about uvicorn and the settings, and reading the
    # real 151k-token tokenizer.json takes transformers ~10 s (tests/integration covers it)
    model, processor = build_tiny("qwen2_5_vl", vocab="bytes")
    model.save_pretrained(model_dir)
    processor.save_pretrained(model_dir)
    port = _free_port()
    env = {
        **os.environ,
        "LAD_MODEL": str(model_dir),
        "LAD_TORCH_THREADS": "1",
        "LAD_STORE_URL": str(tmp_path / "profiles"),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            *("-m", "app.cli", "serve", "--port", str(port)),
            *("--served-model-name", "tiny-served"),
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else "exited"
            try:
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the service never became ready"
            time.sleep(0.2)
        with httpx.Client(base_url=base, timeout=60) as http:
            assert http.get("/healthz").json() == {"status": "ok"}
            assert http.post("/v1/calibrate", json=calibrate_json).status_code == 200
            answer = http.post("/v1/retrieve", json=retrieve_body(items[0])).json()
            assert answer["profile"]["version"] == 1 and answer["model"] == "tiny-served"
            assert http.get("/v1/models").json()["data"][0]["id"] == "tiny-served"
            assert "lad_requests_total" in http.get("/metrics").text
        # the embedded file store persisted the profile under the configured directory
        assert any((tmp_path / "profiles").iterdir())
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    assert proc.returncode in (0, -15)


def test_lad_serve_refuses_an_open_admin_on_a_public_address(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAD_")}
    env.update(PYTHONPATH=str(ROOT), LAD_STORE_URL="memory://")
    command = [sys.executable, "-m", "app.cli", "serve", "--host", "0.0.0.0", "--port", "1"]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "LAD_ADMIN_TOKEN" in done.stderr and "LAD_ALLOW_OPEN_ADMIN" in done.stderr
