"""The tiny build's fills of settings a default config leaves unset (configs only, no model)."""

from __future__ import annotations

import pytest
import transformers
from transformers import (
    CohereCompassConfig,
    DeepseekOcr2Config,
    Gemma3Config,
    HunYuanVLConfig,
    LlavaConfig,
)

from lad_lab.testing.generic.defaults import fill_unset
from lad_lab.testing.generic.shrink import (
    CODEBOOK,
    CONV_WIDTH,
    config_tree,
    lay_out_code_ranges,
    shrink_channel_lists,
    shrink_conv_towers,
)


def _apertus1p5() -> transformers.PretrainedConfig:
    """apertus1p5's default config (a type transformers 5.24 added: the lowest-versions job
    runs 5.23.0, which has none)."""
    config_cls = getattr(transformers, "Apertus1p5Config", None)
    if config_cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no apertus1p5")
    return config_cls()


def _filled(config):
    fill_unset(config_tree(config), config.get_text_config())
    return config


def test_unset_settings_are_filled_by_transformers_conventions() -> None:
    text = _filled(CohereCompassConfig()).text_config  # default: no rope parameters at all
    assert set(text.rope_parameters) == {"full_attention"}
    assert text.rope_parameters["full_attention"]["rope_type"] == "default"
    hunyuan = _filled(HunYuanVLConfig()).text_config
    assert hunyuan.head_dim == hunyuan.hidden_size // hunyuan.num_attention_heads
    deepseek = _filled(DeepseekOcr2Config()).text_config
    assert deepseek.mlp_layer_types[0] == "dense"
    assert set(deepseek.mlp_layer_types[1:]) == {"sparse"}
    assert len(deepseek.mlp_layer_types) == deepseek.num_hidden_layers
    assert deepseek.num_experts_per_tok == 2


def test_settings_a_default_already_has_are_left_alone() -> None:
    before = Gemma3Config()
    after = _filled(Gemma3Config())
    assert after.text_config.rope_parameters == before.text_config.rope_parameters
    assert after.text_config.head_dim == before.text_config.head_dim
    assert _filled(LlavaConfig()).to_dict() == LlavaConfig().to_dict()


def test_code_ranges_follow_the_vocabulary_in_their_order() -> None:
    config = _apertus1p5()
    assert config.image_token_offset < config.audio_token_offset
    vocabulary = lay_out_code_ranges(config_tree(config), 300)
    assert (config.image_token_offset, config.audio_token_offset) == (300, 300 + CODEBOOK)
    assert vocabulary == 300 + 2 * CODEBOOK
    assert config.vision_config.codebook_size == config.audio_config.codebook_size == CODEBOOK
    assert lay_out_code_ranges(config_tree(LlavaConfig()), 300) == 300  # no code ranges


def test_convolutional_widths_are_shrunk() -> None:
    config = _apertus1p5()
    shrink_conv_towers(config_tree(config))
    vq = config.vision_config
    assert (vq.base_channels, vq.latent_channels, vq.num_res_blocks) == (CONV_WIDTH,) * 2 + (1,)
    sam = DeepseekOcr2Config()
    shrink_channel_lists(config_tree(sam), 64)
    assert sam.vision_config.sam_config.downsample_channels == [64, 64]
