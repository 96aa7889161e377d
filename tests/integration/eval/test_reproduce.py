"""``scripts/reproduce_paper.sh`` on the demo model and a tiny checkpoint that needs remote
code (the demo's weights behind a class of its own Python file), on a small COCO-format
set made in code (a tiny random CLIP for the adversarial negatives): refused before
anything runs without the permission, both comparisons written with it, resumed after a
kill; the dry run needs no model, no CLIP and no data; the paper's numbers beside ours."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import transformers

from app.models.loader import DEMO_MODEL_DIR
from lad_lab.eval import cli, reproduce
from tests.unit.eval.fixtures import tiny_clip, write_coco

ROOT = Path(__file__).resolve().parents[3]
FIRST, SECOND = "Qwen2.5-VL-3B", "LLaVA-OneVision-8B"
RUN = cli.main  # the real one, before any test replaces it
TINY = ["--calibration", "1", "--orderings", "2", "--bootstrap", "50", "--quiet"]


def remote_code_checkpoint(folder: Path) -> Path:
    """The demo model as a checkpoint whose class lives in its own Python file (auto_map,
    an architecture transformers does not have): loading it needs trust_remote_code."""
    from safetensors.torch import save_model

    folder.mkdir(parents=True)
    for f in Path(DEMO_MODEL_DIR).iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != "README.md":
            (folder / f.name).write_bytes(f.read_bytes())
    # the weights under the loaded model's own names (a class of its own gets no renaming)
    demo = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(DEMO_MODEL_DIR)
    save_model(demo, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["RemoteDemoModel"]
    config["auto_map"] = {"AutoModelForImageTextToText": "modeling_remote_demo.RemoteDemoModel"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "modeling_remote_demo.py").write_text(
        "from transformers import Qwen2_5_VLForConditionalGeneration\n\n\n"
        "class RemoteDemoModel(Qwen2_5_VLForConditionalGeneration):\n"
        '    """The demo model under a name of its own."""\n'
    )
    return folder


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("reproduce")
    captions, images, instances = write_coco(root / "coco", count=30)
    return {
        "captions": captions,
        "images": images,
        "instances": instances,
        "clip": tiny_clip(root / "clip"),
        "remote": remote_code_checkpoint(root / "remote-demo"),
        "cache": root / "cache",
    }


def _argv(world, out: Path, *more: str) -> list[str]:
    return [
        "--model",
        f"{FIRST}=demo",
        "--model",
        f"{SECOND}={world['remote']}",
        "--data",
        str(world["captions"]),
        "--images",
        str(world["images"]),
        "--instances",
        str(world["instances"]),
        "--clip",
        str(world["clip"]),
        "--out",
        str(out),
        *more,
    ]


class Killed(BaseException):
    """The process killed mid-run: nothing after it runs (not an Exception)."""


class Calls:
    """cli.main, counted, optionally 'killed' at one model's start."""

    def __init__(self, kill: str | None = None) -> None:
        self.models: list[str] = []
        self.kill = kill
        self._main = RUN

    def __call__(self, argv, prog="lad eval"):
        model = argv[argv.index("--model") + 1]
        self.models.append(model)
        if self.kill is not None and model == self.kill:
            raise Killed
        return self._main(argv, prog)


def test_the_dry_run_needs_no_model_no_clip_and_no_data(monkeypatch, capsys, tmp_path) -> None:
    import app.models.loader as loader

    monkeypatch.setattr(loader, "load_runner", lambda *a, **k: pytest.fail("model loaded"))
    argv = ["--model", f"{FIRST}=/nowhere", "--model", "B=/nowhere", "--dry-run"]
    assert reproduce.main([*argv, "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert not (tmp_path / "out").exists()
    # 1,000 items x 5 orderings: CoT 1,023 and 10 SC samples x 511 decode steps at most
    assert "at most 30,665,000 decode steps" in out
    assert "perm_avg" in out and "80,000 prompt forwards" in out
    assert "2 model(s) x 2 settings x 1000 items" in out and "GPU-hours" in out
    assert "±3.1 points at 1000 items" in out
    assert reproduce.main([*argv, "--quick", "--out", str(tmp_path / "q")]) == 0
    quick = capsys.readouterr().out
    assert "cot" not in quick and "±9.8 points at 100 items" in quick


def test_refused_before_anything_runs_without_the_permission(
    world, tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.delenv("LAD_TRUST_REMOTE_CODE", raising=False)
    monkeypatch.chdir(tmp_path)  # no .env of the checkout
    calls = Calls()
    monkeypatch.setattr(cli, "main", calls)
    out = tmp_path / "out"
    argv = _argv(world, out, "--quick")
    argv[argv.index("--data") + 1] = str(tmp_path / "captions_val2014.json")  # a wrong path
    assert reproduce.main(argv) == 2
    lines = capsys.readouterr().out.splitlines()
    assert calls.models == [] and not out.exists()
    assert lines[0].startswith(f"ok   {FIRST}: ok (qwen2_5_vl")
    assert lines[1].startswith(f"FAIL {SECOND}: {world['remote']} runs its own Python code")
    assert "LAD_TRUST_REMOTE_CODE=true" in lines[1]
    wrong = tmp_path / "captions_val2014.json"
    assert lines[2] == f"FAIL --data {wrong}: no such file; fix the path"
    assert len(lines) == 6  # one line per model and per path


@pytest.mark.slow
def test_both_comparisons_written_and_a_killed_run_resumes(
    world, tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("LAD_TRUST_REMOTE_CODE", "true")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        transformers.dynamic_module_utils, "HF_MODULES_CACHE", str(tmp_path / "modules")
    )
    out = tmp_path / "out"
    argv = _argv(world, out, "--quick", "--items", "2", "--", *TINY)
    argv += ["--cache-dir", str(world["cache"])]
    killed = Calls(kill=str(world["remote"]))
    monkeypatch.setattr(cli, "main", killed)
    with pytest.raises(Killed):  # killed as the second model starts
        reproduce.main(argv)
    first = (out / FIRST / "comparison.md").read_text()  # written as soon as it finished
    assert f"{FIRST}, N = 4, random" in first and f"{FIRST}, N = 4, adversarial" in first
    assert "| 51.7 | 36.3 | 6.6 |" in first  # the paper's vanilla row, beside ours
    assert not (out / SECOND / "comparison.md").exists()

    again = Calls()
    monkeypatch.setattr(cli, "main", again)
    capsys.readouterr()
    assert reproduce.main(argv) == 0
    assert again.models == [str(world["remote"])]  # the first model is not run again
    assert f"{FIRST} single: finished earlier" in capsys.readouterr().out
    second = (out / SECOND / "comparison.md").read_text()
    assert f"{SECOND}, N = 4, adversarial" in second and "| 67.5 | 25.4 | 19.9 |" in second
    # loaded through its own Python file (transformers' dynamic-module copy of it)
    assert any("RemoteDemoModel" in f.read_text() for f in (tmp_path / "modules").rglob("*.py"))
    doc = json.loads((out / "comparison.json").read_text())
    assert set(doc) == {f"{k}/{s}" for k in (FIRST, SECOND) for s in ("random", "adversarial")}
    assert set(doc[f"{SECOND}/random"]) == set(reproduce.STAGES["single"])
    protocol = json.loads((out / SECOND / "single" / "protocol.json").read_text())
    assert protocol["protocol"] == "paper" and protocol["engine"]["sink_guard"] is False


@pytest.mark.slow
def test_reproduce_script_every_stage_on_the_demo_model(world, tmp_path) -> None:
    out = tmp_path / "paper"
    command = [
        str(ROOT / "scripts" / "reproduce_paper.sh"),
        *_argv(world, out, "--items", "2")[2:],  # the demo model only
        "--",
        *TINY,
        "--cot-max-new-tokens",
        "3",
        "--sc-max-new-tokens",
        "3",
        "--samples",
        "2",
        "--cache-dir",
        str(world["cache"]),
    ]
    command[1:3] = ["--model", f"{FIRST}=demo"]
    env = {**os.environ, "LAD_PYTHON": sys.executable}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    text = (out / "comparison.md").read_text()
    assert "Attn readout + prior" in text and "Self-Consistency" in text and "perm_avg" in text
    for stage, methods in reproduce.STAGES.items():
        protocol = json.loads((out / FIRST / stage / "protocol.json").read_text())
        assert protocol["methods"] == list(methods) and len(protocol["runs"]) == 2
