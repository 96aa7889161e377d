"""app.models.hub_access: a hub name known loadable or not at once, its libraries' lines once."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import pytest

from app.models import hub_access

ROOT = Path(__file__).resolve().parents[2]

ONE_LOG = """
import logging
from app.observability.logs import configure_logging
from app.models.hub_access import log_once
import huggingface_hub.utils.logging as hub_logging
import transformers

configure_logging("info", "text")
hub_logging.get_logger("huggingface_hub.utils._http").warning("hub says %s", "once")
transformers.utils.logging.get_logger("transformers.x").warning("transformers says once")
log_once()
hub_logging.get_logger("huggingface_hub.utils._http").warning("hub says %s", "after")
transformers.utils.logging.get_logger("transformers.x").warning("transformers says after")
"""


def test_hub_warnings_are_written_once_in_the_service_format() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", ONE_LOG], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    # before: huggingface_hub's own handler (2.x adds one) and the service's both wrote it
    assert sum("hub says once" in line for line in lines) in (1, 2)
    after = [line for line in lines if "says after" in line]
    assert len(after) == 2, done.stderr  # one line each, and each in the service's format
    assert all(" WARNING " in line for line in after)


@pytest.fixture
def closed_hub(monkeypatch):
    """A hub endpoint where nothing listens (connection refused), offline mode restored."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    return port


def _cache(tmp_path: Path, monkeypatch, name: str) -> None:
    """A cache holding ``name``'s config.json at main, the layout huggingface_hub writes."""
    repo = tmp_path / f"models--{name.replace('/', '--')}"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text("{}")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))


def test_unreachable_and_not_cached_is_known_at_once(tmp_path, monkeypatch, closed_hub):
    _cache(tmp_path, monkeypatch, "someone/other")
    cause = hub_access.unavailable("someone/uncached", None)
    assert cause is not None and "refused" in str(cause).lower()
    assert huggingface_hub.constants.HF_HUB_OFFLINE is False


def test_unreachable_but_cached_loads_from_the_cache_only(tmp_path, monkeypatch, closed_hub):
    _cache(tmp_path, monkeypatch, "someone/cached")
    assert hub_access.unavailable("someone/cached", None) is None
    assert huggingface_hub.constants.HF_HUB_OFFLINE is True  # no retries per optional file


def test_offline_and_not_cached_needs_no_probe(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub_access, "_probe", lambda: pytest.fail("probed an offline hub"))
    cause = hub_access.unavailable("someone/uncached", None)
    assert cause is not None and "HF_HUB_OFFLINE" in str(cause)
    _cache(tmp_path, monkeypatch, "someone/cached")
    assert hub_access.unavailable("someone/cached", None) is None
