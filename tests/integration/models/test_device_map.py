"""LAD_DEVICE_MAP: a model dispatched by accelerate, with decoder layers, the vision tower
and the LM head offloaded to disk (their weights stay on the meta device and are loaded at
each forward), scores and captures exactly as the same model on one device, under both
captures and both label paths (folded chain, cached steps on a row-selected KV cache).

This machine has one device, so every offloaded module still computes on the CPU: the
gathering of rows from *different* devices (``aggregate_spans``, ``_select_cache_rows``,
the cached step's index moves) runs here only as same-device moves."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from app.engine.attention import EAGER_HOOK_CAPTURE, SDPA_CAPTURE
from app.engine.interface import RetrievalItem
from app.engine.runner import Runner
from app.models.loader import load_runner
from app.models.registry import adapter_for
from lad_lab.testing.tiny_models import build_tiny, random_images

accelerate = pytest.importorskip("accelerate")  # a dev dependency; the multi-gpu extra
torch.set_num_threads(1)
LAYERS = 6


def _items() -> list[RetrievalItem]:
    images = random_images(10, seed=8, sizes=[(48, 48), (64, 40), (40, 72)])
    return [RetrievalItem("a red square", images[:3]), RetrievalItem("two dogs", images[3:10])]


def _runner(capture: str, offload_dir: Path | None = None) -> Runner:
    model, processor = build_tiny("qwen2_5_vl", seed=1, num_hidden_layers=LAYERS)
    if offload_dir is not None:
        device_map = {
            "model.visual": "disk",
            "model.language_model.embed_tokens": "cpu",
            "model.language_model.norm": "cpu",
            "model.language_model.rotary_emb": "cpu",
            "lm_head": "disk",
            **{
                f"model.language_model.layers.{i}": "disk" if i % 2 else "cpu"
                for i in range(LAYERS)
            },
        }
        model = accelerate.dispatch_model(
            model, device_map, main_device="cpu", offload_dir=str(offload_dir)
        )
        assert model.model.language_model.layers[1].self_attn.q_proj.weight.is_meta
        assert model.lm_head.weight.is_meta and next(model.parameters()).is_meta
    adapter = adapter_for(model.config)(model, processor)
    adapter.capture = capture
    return Runner(adapter, model_id="tiny", layers=range(1, LAYERS))


@pytest.mark.parametrize("capture", [SDPA_CAPTURE, EAGER_HOOK_CAPTURE])
def test_a_dispatched_model_with_offloaded_layers_equals_one_device(tmp_path, capture) -> None:
    single, spread = _runner(capture), _runner(capture, tmp_path)
    assert spread.device == torch.device("cpu")  # inputs go to the CPU, not to meta
    items = _items()
    for labels in ("digits", "words"):
        a, b = single.forward(items, labels), spread.forward(items, labels)
        for x, y in zip(a.attention + a.scores, b.attention + b.scores, strict=True):
            np.testing.assert_allclose(y, x, atol=1e-6, rtol=0)


def test_lad_device_map_auto_loads_through_the_real_path(tmp_path) -> None:
    """`LAD_DEVICE_MAP=auto` through load_runner (transformers' from_pretrained + accelerate)."""
    model, processor = build_tiny("qwen2_5_vl", seed=1, num_hidden_layers=LAYERS)
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    single = load_runner(str(tmp_path), device="cpu", layers=range(1, LAYERS))
    auto = load_runner(str(tmp_path), device_map="auto", layers=range(1, LAYERS))
    # one CPU: "auto" places everything on it (the offloaded dispatch is the test above)
    items = _items()
    for labels in ("digits", "words"):
        a, b = single.forward(items, labels), auto.forward(items, labels)
        for x, y in zip(a.attention + a.scores, b.attention + b.scores, strict=True):
            np.testing.assert_allclose(y, x, atol=1e-6, rtol=0)
