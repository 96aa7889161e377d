"""Random models of the released architectures (lad_lab.testing.shapes): the recorded values
reach the built model, narrowing keeps depth, heads and token counts, and they run."""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.runner import RetrievalItem
from lad_lab.testing.shapes import load_shape, narrow, shape_names, shape_runner
from lad_lab.testing.tiny_models import random_images


def test_every_recorded_shape_names_its_source() -> None:
    assert {"qwen2_5_vl-3b", "qwen2_5_vl-7b", "internvl3-8b", "llava_onevision-7b"} <= set(
        shape_names()
    )
    for name in shape_names():
        shape = load_shape(name)
        assert shape["source"].startswith("https://huggingface.co/")
        assert shape["source"].endswith("/config.json")


def test_narrowing_scales_widths_and_keeps_structure() -> None:
    released = load_shape("qwen2_5_vl-3b")
    narrowed = narrow(released, 256)
    text, vision = narrowed["text_config"], narrowed["vision_config"]
    assert text["hidden_size"] == 256 and text["intermediate_size"] == round(11008 / 8)
    for key in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size"):
        assert text[key] == released["text_config"][key]
    assert sum(text["mrope_section"]) == 256 // 16 // 2  # half the narrowed head size
    assert vision["depth"] == 32 and vision["num_heads"] == 16
    assert (vision["hidden_size"] // 16) % 4 == 0  # the vision rotary needs head size % 4
    assert narrow(released, None) is released
    with pytest.raises(ValueError, match="multiple of 32"):
        narrow(released, 200)  # 200 / 16 heads is no whole even head size


def test_a_narrowed_qwen2_5_vl_3b_has_its_real_depth_and_token_counts() -> None:
    runner = shape_runner("qwen2_5_vl-3b", width=128)
    text = runner.model.config.text_config
    assert (text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads) == (
        36,
        16,
        2,
    )
    assert text.vocab_size == 151936
    assert list(runner.layers) == list(range(21, 36))  # Λ: 15 layers of 36
    side = 112
    runner.processor.image_processor.size = {"shortest_edge": side**2, "longest_edge": side**2}
    images = random_images(2, seed=0, sizes=[(side, side)])
    out = runner.forward([RetrievalItem("a cat", images)])
    batch = runner.process([RetrievalItem("a cat", images)])
    pads = int((batch.input_ids == runner.processor.image_token_id).sum())
    assert pads == 2 * (side // 28) ** 2  # the released processor's tokens per image
    assert np.isclose(np.exp(out.scores[0]).sum(), 1.0)
    assert out.attention[0].shape == (15, 2)


@pytest.mark.parametrize(("name", "width"), [("internvl3-8b", 112), ("llava_onevision-7b", 112)])
def test_other_families_build_at_their_real_depth(name: str, width: int) -> None:
    runner = shape_runner(name, width=width)
    text = runner.model.config.text_config
    assert (text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads) == (
        28,
        28,
        4,
    )
    assert list(runner.layers) == list(range(16, 28))
    # square images: one tile each; a 4:3 one is tiled into 12 + 1 (~3.3k tokens an image)
    out = runner.forward([RetrievalItem("a cat", random_images(2, seed=1, sizes=[(48, 48)]))])
    assert np.isclose(np.exp(out.scores[0]).sum(), 1.0)
