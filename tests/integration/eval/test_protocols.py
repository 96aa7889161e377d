"""``lad eval --protocol paper|ours``: protocol.json (and --dry-run without a model), the
paper's shared orderings, 336 px bicubic images and 16-order perm_avg on a COCO-format set
written in code, and each instance's order in predictions.jsonl."""

from __future__ import annotations

import json

import pytest

from lad_lab.eval import cli
from lad_lab.eval.harness import EvalConfig, run_evaluation
from lad_lab.eval.records import read_records
from tests.unit.eval.fixtures import tiny_clip, write_coco


@pytest.fixture(scope="module")
def runner(shared_runner):
    return shared_runner("demo")


class SizeSpy:
    """The runner, recording the size of every image it is given."""

    def __init__(self, runner) -> None:
        self._runner, self.sizes = runner, set()

    def __getattr__(self, name):
        return getattr(self._runner, name)

    def forward(self, items, labels="digits"):
        self.sizes |= {im.size for item in items for im in item.images}
        return self._runner.forward(items, labels)


def test_dry_run_writes_the_paper_protocol_without_a_model(tmp_path, monkeypatch) -> None:
    import app.models.loader as loader

    monkeypatch.setattr(loader, "load_runner", lambda *a, **k: pytest.fail("model loaded"))
    out = tmp_path / "dry"
    argv = [
        "--protocol",
        "paper",
        "--dry-run",
        "-n",
        "4",
        "--items",
        "3",
        "--calibration",
        "2",
        "--methods",
        "vanilla",
        "agd",
        "perm_avg",
        "cot",
        "self_consistency",
        "--out",
        str(out),
    ]
    assert cli.main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == ["protocol.json"]
    doc = json.loads((out / "protocol.json").read_text())
    assert doc["protocol"] == "paper" and doc["dry_run"] is True
    assert doc["image_preprocessing"]["resize"] == [336, 336]
    assert doc["generation"]["self_consistency"]["top_k"] == 40
    (run,) = doc["runs"]
    orders = run["orderings"]
    assert orders["shared_by_every_item"] and orders["count"] == 5
    assert orders["orders"][0] == [0, 1, 2, 3] and len({tuple(o) for o in orders["orders"]}) == 5
    assert len(run["perm_avg_orders"]) == 16 and run["tile_cap"] == 7
    assert run["prompts"]["text"]["cot"].endswith("Answer: <think>")
    fp = run["forward_passes"]
    assert fp["per_instance"]["perm_avg"] == 16 and fp["per_instance"]["agd"] == 1
    assert fp["calibration"] == 2 * 4 and fp["total_at_most"] > 3 * 5 * 16
    assert len(run["items"]) == 3 and len(run["calibration_items"]) == 2
    # the authors' runs: no sink guard, generated vanilla, the checkpoint's settings inherited
    assert doc["engine"]["sink_guard"] is False
    assert doc["answers"]["vanilla"].startswith("generated: 2 greedy tokens")
    gen = doc["generation"]
    assert gen["inherited_from_checkpoint"] is True
    assert gen["checkpoint_generation_config"]["eos_token_id"] == 2  # the demo's file
    assert gen["vanilla_and_instruction"]["max_new_tokens"] == 2
    assert gen["self_consistency"]["top_p"] is None  # not passed: the checkpoint's applies
    assert fp["per_instance"]["vanilla"] == "1 prompt + <= 1 decode steps"
    assert fp["decode_steps_at_most"] == 3 * 5 * (1 + 1023 + 10 * 511)
    notes = " ".join(doc["notes"])
    for said in ("sink guard off", "parse failure counted wrong", "generation_config stays"):
        assert said in notes


class GenerateSpy:
    """The runner, recording the generation_config the model holds at each generate call."""

    def __init__(self, runner) -> None:
        self._runner, self.calls = runner, []
        model = runner.model
        original = model.generate

        def generate(*args, **kwargs):
            self.calls.append((model.generation_config.to_dict(), dict(kwargs)))
            return original(*args, **kwargs)

        self.generate = generate

    def __getattr__(self, name):
        return getattr(self._runner, name)


def test_paper_vanilla_and_instruction_are_generated_and_inherit(runner, tmp_path, monkeypatch):
    spy = GenerateSpy(runner)
    monkeypatch.setattr(runner.model, "generate", spy.generate)
    runner.model.generation_config.repetition_penalty = 1.05  # a checkpoint's own setting
    try:
        config = EvalConfig(
            out=tmp_path,
            protocol="paper",
            ns=[3],
            items=3,
            calibration=2,
            progress=False,
            bootstrap=50,
            methods=["vanilla", "instruction", "agd"],
        )
        metrics = run_evaluation(runner, config)
    finally:
        runner.model.generation_config.repetition_penalty = 1.0
    assert len(spy.calls) == 2  # one batch each for vanilla and instruction
    for held, kwargs in spy.calls:
        assert held["repetition_penalty"] == 1.05  # inherited, not set aside
        assert kwargs["max_new_tokens"] == 2 and kwargs["do_sample"] is False
        assert kwargs["temperature"] == 1.0 and "eos_token_id" not in kwargs
    records = read_records(tmp_path / "predictions.jsonl")
    vanilla = [r for r in records if r["method"] == "vanilla"]
    assert len(vanilla) == 3 * 5 and all(r["samples"] == 1 for r in vanilla)
    for r in vanilla:
        wrong = r["predicted_position"] is None
        assert r["unparseable"] == int(wrong) and (not wrong or r["correct"] is False)
    run = metrics["runs"][0]["methods"]
    assert "unparseable_pct" in run["vanilla"] and "unparseable_pct" in run["instruction"]
    assert "unparseable_pct" not in run["agd"]


@pytest.mark.slow
def test_paper_protocol_on_a_coco_format_set(runner, tmp_path) -> None:
    captions, images, instances = write_coco(tmp_path / "coco", count=30)
    out = tmp_path / "out"
    config = EvalConfig(
        out=out,
        protocol="paper",
        dataset="coco",
        data=captions,
        images=images,
        instances=instances,
        clip=tiny_clip(tmp_path / "clip"),
        cache_dir=tmp_path / "cache",
        settings=["adversarial"],
        ns=[3],
        items=4,
        calibration=2,
        progress=False,
        bootstrap=100,
        methods=["vanilla", "agd", "perm_avg"],
    )
    spy = SizeSpy(runner)
    run_evaluation(spy, config)
    assert spy.sizes == {(336, 336)}  # the 56 px world images, resized bicubic
    doc = json.loads((out / "protocol.json").read_text())
    assert doc["dry_run"] is False and "rendered" in doc["runs"][0]["prompts"]
    assert doc["dataset"]["negatives"] == "paper" and doc["runs"][0]["setting"] == "adversarial"
    assert len(list((tmp_path / "cache").glob("clip_*.npy"))) == 2  # image and caption cosines
    shared = doc["runs"][0]["orderings"]["orders"]
    assert len(shared) == 5  # T = 5 of the 3! = 6 orders
    records = read_records(out / "predictions.jsonl")
    for r in records:
        assert r["order"] == shared[r["ordering"]]
        assert len(r["images"]) == 3 and all(name.endswith(".png") for name in r["images"])
    perm = [r for r in records if r["method"] == "perm_avg"]
    assert {r["forward_passes"] for r in perm} == {6}  # min(16, 3!) orders


def test_ours_is_the_default_and_balanced(runner, tmp_path) -> None:
    config = EvalConfig(
        out=tmp_path,
        ns=[3],
        items=3,
        calibration=2,
        progress=False,
        bootstrap=100,
        methods=["vanilla", "perm_avg"],
    )
    run_evaluation(runner, config)
    doc = json.loads((tmp_path / "protocol.json").read_text())
    assert doc["protocol"] == "ours" and doc["image_preprocessing"]["resize"] is None
    (run,) = doc["runs"]
    # T = 4 rounded up to a multiple of N = 3
    assert run["orderings"]["count"] == 6 and not run["orderings"]["shared_by_every_item"]
    assert run["perm_avg_orders"] == [[0, 1, 2], [1, 2, 0], [2, 0, 1]]
    assert "The answer is 3" not in run["prompts"]["text"]["cot"]
