"""A `lad serve` subprocess on a free loopback port, and its resident memory, for the
benchmarks that measure the whole process (memory, soak)."""

from __future__ import annotations

import os
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
    """`lad serve` on 127.0.0.1 with LAD_* overrides; stopped by `stop()` (or a with block)."""

    def __init__(self, env: dict[str, str], *, ready_timeout_s: float = 180.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = {**os.environ, "LAD_STORE_URL": "memory://", **env}
        command = [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1",
                   "--port", str(self.port)]  # fmt: skip
        # The log goes to a file, not a pipe: nobody drains a pipe while the benchmark runs,
        # and a full pipe (64 KiB of request log lines) blocks the server's event loop.
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (closed by stop())
        self.proc = subprocess.Popen(command, env=full_env, stdout=subprocess.DEVNULL,
                                     stderr=self.log)  # fmt: skip
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lad serve exited: {self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"lad serve was not ready within {ready_timeout_s} s")
            time.sleep(0.3)

    def log_tail(self, chars: int = 2000) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-chars:]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def rss_mib(self) -> float:
        return status_mib(self.pid, "VmRSS")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()

    def __enter__(self) -> Served:
        return self

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
