"""The generic tiny builds' smaller images (lad_lab.testing.generic.images): a fixed-size
tower cut by a whole factor with what is laid out in its units, budgets halved while a
probe runs, linear-attention heads and a generation autoencoder made tiny."""

from __future__ import annotations

from types import SimpleNamespace

from transformers import JanusConfig, LlavaNextConfig, Molmo2Config, Qwen3_5Config

from lad_lab.testing.generic import images


def test_a_fixed_size_tower_is_cut_with_what_is_laid_out_in_its_units() -> None:
    config = LlavaNextConfig()  # 336 px, patch 14: a 24 x 24 grid, 576 tokens an image
    assert images.smaller_images(config) == 3
    assert config.vision_config.image_size == 112  # 8 x 8 patches
    assert config.image_grid_pinpoints[0] == [112, 224]  # [336, 672] / 3
    assert config.image_seq_length == 64
    processor = SimpleNamespace(image_grid_pinpoints=[[336, 672]])
    images.follow_pinpoints(processor, config)
    assert processor.image_grid_pinpoints == config.image_grid_pinpoints


def test_the_grid_keeps_its_parity_and_patch_counts_follow() -> None:
    config = Molmo2Config()  # [378, 378] px, patch 14: 27 x 27 (odd), 729 positions
    assert images.smaller_images(config) == 3
    assert list(config.vision_config.image_size) == [126, 126]  # 9 x 9
    assert config.vision_config.num_position_embeddings == 81
    assert images._factor(7) == 1 and images._factor(32) == 4 and images._factor(16) == 2


def test_only_a_processor_resizing_to_one_size_has_a_fixed_size() -> None:
    assert images.fixed_size(SimpleNamespace(size={"height": 384, "width": 384}))
    assert images.fixed_size(SimpleNamespace(size={"shortest_edge": 224}))
    assert not images.fixed_size(SimpleNamespace(size={"shortest_edge": 378, "longest_edge": 980}))
    assert not images.fixed_size(SimpleNamespace(size=None))


class _Budgeted:
    """A processor whose image processor accepts only some ``max_soft_tokens``."""

    def __init__(self) -> None:
        self.image_processor = SimpleNamespace(max_soft_tokens=1120, min_image_tokens=64)
        self.image_processor.max_image_tokens = 256

    def __call__(self, text, images, return_tensors):
        if self.image_processor.max_soft_tokens not in (140, 280, 560, 1120):
            raise ValueError("unsupported")
        return {}


def test_budgets_are_halved_while_the_probe_runs() -> None:
    processor = _Budgeted()
    images.smaller_budgets(lambda **_: None, processor, "<image>", [])
    assert processor.image_processor.max_soft_tokens == 140  # 70 is refused
    assert processor.image_processor.max_image_tokens == 128  # not below the least budget
    assert processor.image_processor.min_image_tokens == 64


def test_linear_attention_heads_and_a_generation_autoencoder_are_made_tiny() -> None:
    config = Qwen3_5Config()
    text = config.text_config
    ratio = text.linear_num_value_heads // text.linear_num_key_heads
    images.fewer_linear_heads(config, 2)
    assert (text.linear_num_key_heads, text.linear_num_value_heads) == (2, 2 * ratio)
    janus = JanusConfig()
    images.smaller_autoencoder(janus)
    assert janus.vq_config.base_channels == images.CHANNELS
    assert janus.vq_config.num_embeddings == images.CODEBOOK
