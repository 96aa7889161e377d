"""A `lad serve` subprocess on a free loopback port, and its resident memory: for the
benchmarks that measure the whole process (service, memory, soak) and the live tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Served:
    """``lad serve`` on a free 127.0.0.1 port with LAD_* overrides, its log in a file.

    Started by ``start()`` or a with block, stopped by its PID (SIGTERM, SIGKILL after a
    bound). The log goes to a file (``workdir``, else a temporary folder), never a pipe:
    nobody drains a pipe while traffic runs, and a full one (64 KiB of request log lines)
    blocks the server's event loop. The benchmarks and the tests' live service use it.
    """

    def __init__(self, env: dict[str, str] | None = None, *, workdir: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "LAD_STORE_URL": "memory://", **(env or {})}
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="lad-serve-")
        self.workdir = workdir or Path(self._tmp.name)  # type: ignore[union-attr]
        self.log_path = self.workdir / f"lad-serve-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready_timeout_s: float = 180.0) -> Served:
        command = [
            sys.executable,
            "-m",
            "app.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                command, cwd=self.workdir, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                raise RuntimeError(f"lad serve exited {code}:\n{self.log()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"lad serve was not ready within {ready_timeout_s} s:\n{self.log()[-3000:]}"
                )
            time.sleep(0.2)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def rss_mib(self) -> float:
        return status_mib(self.pid, "VmRSS")

    def signal(self, sig: int = signal.SIGTERM) -> None:
        os.kill(self.pid, sig)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, wait up to ``timeout_s``, then SIGKILL; the exit code (0 if never started)."""
        code = 0
        if self.proc is not None:
            if self.proc.poll() is None:
                self.signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
            code = self.proc.returncode
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        return code

    def __enter__(self) -> Served:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def status_mib(pid: int, field: str) -> float:
    """A memory field of /proc/<pid>/status (VmRSS, VmHWM) in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024.0
    raise KeyError(field)


class PeakRSS:
    """Peak resident memory of a process over a block: the kernel's high-water mark
    (VmHWM, reset on entry through /proc/<pid>/clear_refs), with 10 ms sampling as the
    fallback where the reset is not permitted."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._hwm_reset = False

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, status_mib(self.pid, "VmRSS"))
            self._stop.wait(0.01)

    def __enter__(self) -> PeakRSS:
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")
            self._hwm_reset = True
        except OSError:
            self._hwm_reset = False
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2)
        if self._hwm_reset:
            self.peak = max(self.peak, status_mib(self.pid, "VmHWM"))
