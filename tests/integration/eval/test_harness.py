"""``lad eval`` end to end on the demo model: a few synthetic items and each fixture format.

Checked: the files and the record keys of the interface, balanced GT positions, metrics.json
recomputed from predictions.jsonl (+ calibration.json) alone, the score methods equal to the
engine applied one unbatched instance at a time, the ablation flags reaching the engine,
calibration on another setting, the plots and the report, and a fast, complete --help.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from app.engine.interface import RetrievalItem
from app.method.calibrate import estimate_calibration
from app.method.methods import MethodConfig, apply_method
from lad_lab.eval import cli
from lad_lab.eval.datasets import open_dataset
from lad_lab.eval.harness import EvalConfig, run_evaluation
from lad_lab.eval.metrics import compute_metrics
from lad_lab.eval.protocol import apply_ordering
from lad_lab.eval.records import read_records
from tests.unit.eval.fixtures import tiny_clip, write_coco, write_jsonl, write_world_images

KEYS = {
    "item",
    "n",
    "setting",
    "ordering",
    "order",
    "method",
    "gt_position",
    "predicted_position",
    "correct",
    "probabilities",
}
ALL = [
    "vanilla",
    "pride",
    "attn_raw",
    "attn_pure",
    "agd",
    "perm_avg",
    "instruction",
    "cot",
    "self_consistency",
]


@pytest.fixture(scope="module")
def runner(shared_runner):
    return shared_runner("demo")


def _config(out: Path, **overrides) -> EvalConfig:
    values = {
        "out": out,
        "ns": [3],
        "items": 4,
        "orderings": 3,
        "calibration": 2,
        "progress": False,
        "bootstrap": 200,
        "samples": 2,
        "cot_max_new_tokens": 8,
    }
    values.update(overrides)
    return EvalConfig(**values)


def _recompute(out: Path) -> dict:
    calibrations = json.loads((out / "calibration.json").read_text())["runs"]
    metrics = json.loads((out / "metrics.json").read_text())
    b = metrics["bootstrap"]
    return compute_metrics(
        read_records(out / "predictions.jsonl"), calibrations, samples=b["samples"], seed=b["seed"]
    )


@pytest.fixture(scope="module")
def synthetic(runner, tmp_path_factory):
    out = tmp_path_factory.mktemp("synthetic")
    config = _config(out, ns=[2, 3], methods=ALL, command="lad eval (test)")
    return out, run_evaluation(runner, config)


def test_outputs_and_record_keys(synthetic) -> None:
    out, metrics = synthetic
    names = {p.name for p in out.iterdir()}
    assert {
        "predictions.jsonl",
        "calibration.json",
        "metrics.json",
        "report.md",
        "confusion_random_n3.png",
        "recall_random_n2.png",
        "accuracy_vs_n_random.png",
    } <= names
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    records = read_records(out / "predictions.jsonl")
    assert len(records) == len(ALL) * (4 * 4 + 4 * 3)  # T = 3 rounded up to 4 at N = 2
    for r in records:
        assert set(r) >= KEYS
        assert len(r["probabilities"]) == r["n"] and sorted(r["order"]) == list(range(r["n"]))
        assert r["correct"] == (r["predicted_position"] == r["gt_position"])
        assert r["generation"] == (r["method"] in ("cot", "self_consistency"))
    for run in metrics["runs"]:
        assert run["position_counts"] == [run["items"] * run["orderings"] // run["n"]] * run["n"]
        assert set(run["methods"]) == set(ALL)
        assert {"agd-vanilla", "agd-attn_pure", "agd-perm_avg"} <= set(run["paired"])
        m = run["methods"]["agd"]
        for key in (
            "acc",
            "acc_ci",
            "rstd",
            "rstd_noise_floor",
            "cons",
            "recall_by_position",
            "selection_by_position",
            "forward_passes_per_item",
            "latency_ms_per_item",
            "mrr",
            "recall_at_k",
        ):
            assert key in m
        assert run["methods"]["perm_avg"]["forward_passes_per_item"] == run["n"]
        assert run["methods"]["self_consistency"]["generation_based"] is True
        assert len(run["diagnostics"]["roc_auc"]["logits"]) == run["n"]
        assert run["calibration"]["kappa"] >= 0
        assert len(run["calibration"]["attention_prior"]) == 2  # Λ = {2, 3} of the demo


def test_metrics_json_is_recomputable_from_predictions(synthetic) -> None:
    out, _ = synthetic
    written = json.loads((out / "metrics.json").read_text())
    written.pop("config")
    assert _recompute(out) == written


def test_score_methods_equal_the_engine_one_instance_at_a_time(synthetic, runner) -> None:
    out, _ = synthetic
    cal = json.loads((out / "calibration.json").read_text())["runs"]["random_n3"]
    calibration = estimate_calibration(
        np.asarray(cal["scores"]), np.asarray(cal["attention"]), np.asarray(cal["gt_positions"])
    )
    items = {i.id: i for i in open_dataset("synthetic").items(4, 3, "random", 3003)}
    records = [r for r in read_records(out / "predictions.jsonl") if r["n"] == 3]
    for r in records[:: len(records) // 12]:
        if r["method"] not in ("vanilla", "pride", "attn_raw", "attn_pure", "agd"):
            continue
        shown = apply_ordering(items[r["item"]].images, r["order"])
        fwd = runner.forward([RetrievalItem(items[r["item"]].query, shown)])
        expected = apply_method(
            r["method"], fwd.scores[0], fwd.attention[0], calibration, MethodConfig()
        ).probabilities
        np.testing.assert_allclose(r["probabilities"], expected, atol=1e-4)
        assert r["gt_position"] == r["order"].index(items[r["item"]].answer)


def test_report_states_command_seeds_counts_and_plots(synthetic) -> None:
    out, _ = synthetic
    text = (out / "report.md").read_text()
    assert text.startswith("# lad eval report") and "lad eval (test)" in text
    assert "evaluation items 3003, calibration items 2002, orderings 0" in text
    assert "GT position counts [4, 4, 4]" in text  # 4 items x 3 orderings at N = 3
    for name in ("confusion_random_n3.png", "recall_random_n2.png", "accuracy_vs_n_random.png"):
        assert f"]({name})" in text
    assert "plumbing checks" in text and "noise floor" in text


def test_no_prior_ablation_and_calibration_setting(runner, tmp_path) -> None:
    config = _config(
        tmp_path,
        methods=["attn_raw", "attn_pure", "agd"],
        no_prior=True,
        settings=["random"],
        calibration_setting="adversarial",
    )
    run_evaluation(runner, config)
    records = read_records(tmp_path / "predictions.jsonl")
    raw = {
        (r["item"], r["ordering"]): r["predicted_position"]
        for r in records
        if r["method"] == "attn_raw"
    }
    pure = {
        (r["item"], r["ordering"]): r["predicted_position"]
        for r in records
        if r["method"] == "attn_pure"
    }
    assert raw == pure  # without the prior division π ranks as ā
    cal = json.loads((tmp_path / "calibration.json").read_text())["runs"]["random_n3"]
    assert cal["setting"] == "adversarial" and cal["eval_setting"] == "random"
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["config"]["no_prior"] is True


def test_jsonl_through_the_command(tmp_path, capsys) -> None:
    data = write_jsonl(tmp_path / "data", count=6)
    out = tmp_path / "out"
    argv = [
        "--dataset",
        "jsonl",
        "--data",
        str(data),
        "-n",
        "3",
        "--items",
        "4",
        "--calibration",
        "2",
        "--orderings",
        "3",
        "--methods",
        "vanilla",
        "agd",
        "perm_avg",
        "--bootstrap",
        "100",
        "--out",
        str(out),
        "--quiet",
    ]
    assert cli.main(argv) == 0
    assert "agd" in capsys.readouterr().out
    records = read_records(out / "predictions.jsonl")
    assert {r["setting"] for r in records} == {"given"} and records[0]["dataset"] == "jsonl"
    calib_items = json.loads((out / "calibration.json").read_text())["runs"]["given_n3"]["items"]
    assert not set(calib_items) & {r["item"] for r in records}
    written = json.loads((out / "metrics.json").read_text())
    assert written["config"]["command"].startswith("lad eval --dataset jsonl")
    written.pop("config")
    assert _recompute(out) == written


def test_coco_adversarial_with_a_tiny_clip(runner, tmp_path) -> None:
    captions, images, instances = write_coco(tmp_path / "coco", count=14)
    clip = tiny_clip(tmp_path / "clip")
    config = _config(
        tmp_path / "out",
        dataset="coco",
        data=captions,
        images=images,
        instances=instances,
        clip=clip,
        cache_dir=tmp_path / "cache",
        settings=["random", "adversarial"],
        methods=["vanilla", "agd"],
    )
    metrics = run_evaluation(runner, config)
    assert [r["setting"] for r in metrics["runs"]] == ["random", "adversarial"]
    assert list((tmp_path / "cache").glob("clip_*.npy"))
    written = json.loads((tmp_path / "out" / "metrics.json").read_text())
    written.pop("config")
    assert _recompute(tmp_path / "out") == written


def test_flickr_random(runner, tmp_path) -> None:
    images = write_world_images(tmp_path / "flickr", 10)
    token = tmp_path / "captions.txt"
    token.write_text("image,caption\n" + "".join(f"{n},{t}\n" for n, t in images))
    config = _config(
        tmp_path / "out",
        dataset="flickr",
        data=token,
        images=tmp_path / "flickr",
        methods=["vanilla", "attn_pure"],
    )
    (run,) = run_evaluation(runner, config)["runs"]
    assert run["items"] == 4 and run["setting"] == "random"


def test_help_is_fast_and_documents_every_flag() -> None:
    code = (
        "import sys, io, contextlib\nfrom app.cli import main\nbuf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n    try:\n        main(['eval', '--help'])\n"
        "    except SystemExit:\n        pass\n"
        "assert 'torch' not in sys.modules and 'matplotlib' not in sys.modules\n"
        "print(buf.getvalue())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    for action in cli.build_parser()._actions:
        for flag in action.option_strings:
            assert flag in text
    for flag in (
        "--eval-seed",
        "--calibration-seed",
        "--top-k",
        "--tau",
        "--layers",
        "--posterior-variant",
        "--mixture",
        "--no-prior",
        "--calibration-setting",
        "--labels",
        "--prompt-variant",
        "--clip",
    ):
        assert flag in text
    assert "(default: 200)" in text and "ours: 4" in text and "--protocol" in text
