"""protocol.json's helpers: the InternVL tile cap applied for one run and restored, and Λ
resolved from a model's config alone (the paper's 21..35, clipped to the depth)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lad_lab.eval.harness import EvalConfig
from lad_lab.eval.protocol_record import model_depth, resolve_layers, tile_budget


def test_tile_budget_caps_a_tiling_processor_for_one_run() -> None:
    processor = SimpleNamespace(max_patches=12, min_patches=1)
    runner = SimpleNamespace(processor=SimpleNamespace(image_processor=processor))
    with tile_budget(runner, 4, on=True) as cap:
        assert cap == 7 and processor.max_patches == 7  # min(12, 28 // 4)
    assert processor.max_patches == 12 and processor.min_patches == 1
    with tile_budget(runner, 4, on=False) as cap:
        assert cap is None and processor.max_patches == 12
    qwen = SimpleNamespace(processor=SimpleNamespace(image_processor=SimpleNamespace()))
    with tile_budget(qwen, 4, on=True) as cap:  # no tiles to cap
        assert cap is None


def test_layers_from_the_config_alone(tmp_path) -> None:
    from transformers import Qwen2Config

    Qwen2Config(
        num_hidden_layers=36,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=100,
    ).save_pretrained(tmp_path)
    assert model_depth(str(tmp_path)) == 36
    paper = EvalConfig(out=tmp_path, model=str(tmp_path), protocol="paper")
    assert resolve_layers(paper) == list(range(21, 36))
    ours = EvalConfig(out=tmp_path, model=str(tmp_path))
    assert resolve_layers(ours) == list(range(21, 36))  # round(0.58 * 36) = 21 .. 35 too
    assert resolve_layers(EvalConfig(out=tmp_path, model="demo", protocol="paper")) == [2, 3]
    assert model_depth(str(tmp_path / "missing")) is None


def test_depth_of_a_remote_code_config_without_running_its_code(tmp_path, monkeypatch) -> None:
    """config.json is read as JSON: a checkpoint whose classes live in its own files (which
    are absent here) still gives its depth, and nothing asks "run custom code? [y/N]"."""
    import builtins
    import json

    monkeypatch.setattr(builtins, "input", lambda *a: pytest.fail("prompted"))
    config = {
        "model_type": "llavaonevision1_5",
        "auto_map": {"AutoConfig": "configuration_x.XConfig"},
        "text_config": {"num_hidden_layers": 36},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert model_depth(str(tmp_path)) == 36
    (tmp_path / "config.json").write_text(json.dumps({"llm_config": {"num_layers": 28}}))
    assert model_depth(str(tmp_path)) == 28
    (tmp_path / "config.json").write_text("{not json")
    assert model_depth(str(tmp_path)) is None
