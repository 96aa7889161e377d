"""The Dockerfile and its build context, checked without a Docker engine.

hadolint lints it; the rest reads what a build would do: a base image pinned by digest,
dependencies from the hash-checked lock file, the torch variant switch, PID 1 in exec
form, a numeric user, the writable store directory, and a build context (.dockerignore)
that holds everything stage 1 needs to build the wheel and the runtime stage its lock.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import zipfile
from pathlib import Path

from tests.deploy.conftest import (
    ROOT,
    dockerfile_env,
    dockerfile_instructions,
    dockerfile_uid,
    run,
    tool,
)

DOCKERFILE = (ROOT / "Dockerfile").read_text()
instructions = dockerfile_instructions


def test_hadolint_finds_nothing() -> None:
    done = run(
        [tool("hadolint"), "--failure-threshold", "style", "--format", "json", "Dockerfile"],
        check=False,
    )
    assert done.returncode == 0 and json.loads(done.stdout or "[]") == [], done.stdout


def test_every_hadolint_ignore_is_justified_by_a_comment() -> None:
    lines = DOCKERFILE.splitlines()
    for i, line in enumerate(lines):
        if "hadolint ignore=" in line:
            rule = line.split("=", 1)[1].strip()
            above = " ".join(lines[max(0, i - 4) : i])
            assert rule in above, f"line {i + 1}: ignore of {rule} without a reason above it"


def test_base_image_is_an_exact_python_3_11_patch_release_pinned_by_digest() -> None:
    images = [a.split("=", 1)[1] for a in instructions("ARG") if a.startswith("PYTHON_IMAGE=")]
    assert images and re.fullmatch(
        r"python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}", images[0]
    ), images
    assert all(f.split()[0] == "${PYTHON_IMAGE}" for f in instructions("FROM"))


def test_dependencies_come_from_the_lock_file_hash_checked_before_torch_and_the_wheel() -> None:
    runs = instructions("RUN")
    (lock,) = [i for i, r in enumerate(runs) if "requirements/serve.txt" in r]
    (torch,) = [i for i, r in enumerate(runs) if "TORCH_VARIANT" in r]
    (wheel,) = [i for i, r in enumerate(runs) if "lad_serve-" in r]
    assert lock < torch < wheel
    assert "--require-hashes --no-deps -r /tmp/requirements/serve.txt" in runs[lock]
    assert "source=requirements/serve.txt" in runs[lock]
    assert '--no-deps "$1"' in runs[wheel] and "pip check" in runs[wheel]
    assert "[" not in runs[wheel].split("pip install", 1)[1].split("&&")[0]  # no extras resolved


def test_torch_variant_is_cuda_by_default_and_cpu_by_argument() -> None:
    assert "TORCH_VARIANT=cuda" in instructions("ARG")
    assert "TORCH_VERSION=2.13.0" in instructions("ARG")
    assert "TORCH_CPU_INDEX_URL=https://download.pytorch.org/whl/cpu" in instructions("ARG")
    (install,) = [r for r in instructions("RUN") if "TORCH_VARIANT" in r]
    cuda = re.search(r"cuda\)([^;]*);;", install).group(1)
    cpu = re.search(r"cpu\)([^;]*);;", install).group(1)
    assert '"torch==${TORCH_VERSION}"' in cuda and "--index-url" not in cuda
    assert '"torch==${TORCH_VERSION}"' in cpu and '--index-url "${TORCH_CPU_INDEX_URL}"' in cpu
    assert "exit 1" in install  # any other value stops the build


def test_lad_serve_is_pid_1_in_exec_form_as_a_numeric_user() -> None:
    (cmd,) = instructions("CMD")
    assert json.loads(cmd) == ["lad", "serve"]
    assert not instructions("ENTRYPOINT")
    user = instructions("USER")[-1]
    assert re.fullmatch(r"\d+:\d+", user) and not user.startswith("0:"), user
    (healthcheck,) = instructions("HEALTHCHECK")
    probe = json.loads(healthcheck.split("CMD", 1)[1])
    assert probe[0] == "python" and "/healthz" in probe[-1]


def test_service_listens_on_all_interfaces_and_writes_only_its_own_directories() -> None:
    env = dockerfile_env()
    assert env["LAD_HOST"] == "0.0.0.0" and env["LAD_PORT"] == "8000"
    assert env["LAD_STORE_URL"].startswith("/srv/lad/var/")
    assert env["HF_HOME"] == "/srv/lad/hf" and env["HF_HUB_OFFLINE"] == "1"
    uid = dockerfile_uid()
    (setup,) = [r for r in instructions("RUN") if "useradd" in r]
    assert f"--uid {uid}" in setup
    assert f"chown {uid}:{uid} /srv/lad/var /srv/lad/hf" in setup


def dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern that matches the path or one of its parents wins."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        glob = pattern.lstrip("!").rstrip("/")
        regex = re.escape(glob).replace(r"\*\*/", "(.*/)?").replace(r"\*", "[^/]*")
        if any(re.fullmatch(regex, p) for p in prefixes):
            excluded = not negate
    return excluded


def test_dockerignore_keeps_exactly_the_wheel_inputs(tmp_path: Path) -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    context = tmp_path / "context"
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in {".git", ".venv"}]
        for name in files:
            rel = (Path(folder) / name).relative_to(ROOT).as_posix()
            if not dockerignore_excludes(rel, patterns):
                (context / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, context / rel)
    top = {p.name for p in context.iterdir()}
    assert top == {
        "pyproject.toml",
        "README.md",
        "app",
        "calibration_store",
        "clients",
        "requirements",
    }, top
    assert {p.name for p in (context / "clients" / "python").iterdir()} == {"lad_client"}
    assert [p.name for p in (context / "requirements").iterdir()] == ["serve.txt"]
    assert not list(context.rglob("__pycache__"))
    for copy in instructions("COPY"):
        if "--from" not in copy:
            for source in copy.split()[:-1]:
                assert (context / source).exists(), f"COPY {source}: not in the build context"
    for source in re.findall(r"--mount=type=bind,source=([^,\s]+)", " ".join(instructions("RUN"))):
        assert (context / source).exists(), f"bind mount {source}: not in the build context"
    # Stage 1 of the Dockerfile, on exactly that context.
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(tmp_path / "wheels"),
            str(context),
        ],
        timeout=120,
    )
    (wheel,) = (tmp_path / "wheels").glob("lad_serve-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "app/main.py",
        "app/models/demo/model.safetensors",
        "calibration_store/__init__.py",
        "lad_client/__init__.py",
        "lad_client/types/retrieve.py",
        "lad_client/py.typed",
    } <= names
    # the image carries the service only: the demo model's files, never the lab
    demo = {f"app/models/demo/{f.name}" for f in (ROOT / "app" / "models" / "demo").iterdir()}
    assert len(demo) == 9 and demo <= names, demo - names
    assert not [n for n in names if n.startswith("lad_lab")]
