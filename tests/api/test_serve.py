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

from lad_lab.testing.tiny_models import build_tiny
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
    log = proc.stdout.read() if proc.stdout else ""
    ready = [line for line in log.splitlines() if ": ready: " in line]
    assert len(ready) == 1 and f"ready: serving on http://127.0.0.1:{port}" in ready[0], log
    assert log.index("loaded in") < log.index("ready: serving on"), "ready before the model"
    # the C heap's policy is set before the model load starts threads (app.engine.host_memory)
    assert log.index("host memory: retain") < log.index("loaded in"), log


def test_lad_serve_refuses_an_open_admin_on_a_public_address(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAD_")}
    env.update(PYTHONPATH=str(ROOT), LAD_STORE_URL="memory://")
    command = [sys.executable, "-m", "app.cli", "serve", "--host", "0.0.0.0", "--port", "1"]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "LAD_ADMIN_TOKEN" in done.stderr and "LAD_ALLOW_OPEN_ADMIN" in done.stderr


def _serve(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`lad serve` with only the given LAD_* variables, to its exit."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("LAD_", "HF_"))}
    clean.update(PYTHONPATH=str(ROOT), LAD_STORE_URL="memory://", HF_HOME=str(tmp_path / "hf"))
    clean.update(env)
    command = [sys.executable, "-m", "app.cli", "serve", *args]
    return subprocess.run(
        command, cwd=tmp_path, env=clean, capture_output=True, text=True, timeout=120
    )


def test_a_busy_port_fails_at_once_before_the_model_is_loaded(tmp_path):
    from app.serve import EXIT_PORT_BUSY

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _serve(tmp_path, "--port", str(port), LAD_MODEL=str(tmp_path / "no-model"))
    assert done.returncode == EXIT_PORT_BUSY, done.stderr
    assert f"port {port} on 127.0.0.1 is already in use" in done.stderr
    assert "loading model" not in done.stderr and ": ready: " not in done.stderr


def test_an_address_of_another_machine_has_its_own_exit_status(tmp_path):
    from app.serve import EXIT_CANNOT_BIND

    # 192.0.2.1 is TEST-NET-1: never an address of this machine
    done = _serve(tmp_path, "--host", "192.0.2.1", "--port", "8000", LAD_ADMIN_TOKEN="t" * 16)
    assert done.returncode == EXIT_CANNOT_BIND, done.stderr
    assert "cannot bind 192.0.2.1:8000" in done.stderr


@pytest.mark.parametrize("hub", ["offline", "unreachable"])
def test_an_uncached_hub_name_fails_at_once_without_retries(tmp_path, hub):
    from app.serve import EXIT_MODEL_UNAVAILABLE

    env = {"HF_HUB_OFFLINE": "1"} if hub == "offline" else {}
    if hub == "unreachable":  # a hub address where nothing listens: connection refused
        env["HF_ENDPOINT"] = f"http://127.0.0.1:{_free_port()}"
    done = _serve(tmp_path, "--port", str(_free_port()), LAD_MODEL="someone/uncached", **env)
    assert done.returncode == EXIT_MODEL_UNAVAILABLE, done.stderr
    assert "cannot load model 'someone/uncached'" in done.stderr
    why = "HF_HUB_OFFLINE=1" if hub == "offline" else "the hub could not be reached"
    assert why in done.stderr
    assert "Retry" not in done.stderr and "thrown while requesting" not in done.stderr
    assert ": ready: " not in done.stderr


def test_a_store_that_cannot_open_is_a_start_up_failure_of_its_own(tmp_path):
    from app.serve import EXIT_APP_STARTUP_FAILED

    (tmp_path / "a-file").write_text("")
    done = _serve(
        tmp_path,
        "--port",
        str(_free_port()),
        LAD_MODEL="demo",
        LAD_TORCH_THREADS="1",
        LAD_STORE_URL=str(tmp_path / "a-file" / "profiles"),
    )
    assert done.returncode == EXIT_APP_STARTUP_FAILED, done.stderr
    assert "cannot open profile directory" in done.stderr and ": ready: " not in done.stderr
