"""A real `lad serve` for tests: a subprocess on a free loopback port, its log in a file,
stopped by its PID (SIGTERM, then SIGKILL after a bound)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def save_tiny_model(directory: Path, family: str = "qwen2_5_vl") -> Path:
    """A tiny random model of ``family`` saved the way a real checkpoint is."""
    from app.testing.tiny_models import build_tiny

    model, processor = build_tiny(family)
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory


class LiveService:
    """``lad serve`` with ``env`` (LAD_* settings) in ``workdir``; ``url`` once started."""

    def __init__(self, workdir: Path, env: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / f"lad-serve-{self.port}.log"
        self.env = {
            **os.environ, "LAD_TORCH_THREADS": "1", "OMP_NUM_THREADS": "1",
            "LAD_STORE_URL": "memory://", "LAD_LOG_FORMAT": "json",
            "LAD_PORT": str(self.port), "LAD_HOST": "127.0.0.1", "PYTHONPATH": str(ROOT),
            **(env or {}),
        }  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready_timeout: float = 180) -> LiveService:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "app.cli", "serve"], cwd=self.workdir, env=self.env,
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + ready_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lad serve exited {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"lad serve was not ready in {ready_timeout} s:\n{self.log()}")
            time.sleep(0.2)

    def signal(self, sig: int = signal.SIGTERM) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, wait up to ``timeout``, then SIGKILL; the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_lines(self) -> list[dict[str, Any]]:
        """The JSON log lines (LAD_LOG_FORMAT=json); other lines are skipped."""
        lines = []
        for line in self.log().splitlines():
            try:
                lines.append(json.loads(line))
            except ValueError:
                continue
        return lines

    def __enter__(self) -> LiveService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
