"""The generic path's helpers that read transformers' own sources and the built modules:
parent types from a modular source, rope sections fitted to the rotary width, the parts of
a processor besides its tokenizer, and image runs that stay apart where images touch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import InstructBlipProcessor, LlavaProcessor

from app.models.generic import GenericAdapter
from lad_lab.testing.generic.classes import (
    inherited_processor_name,
    parent_types,
    second_tokenizers,
)
from lad_lab.testing.generic.defaults import rope_sections_agreed, scaled_sections


def test_a_flattened_config_finds_its_parent_type_in_the_modular_source() -> None:
    # configuration_fast_vlm.py derives FastVlmConfig from PreTrainedConfig only;
    # modular_fast_vlm.py says `class FastVlmConfig(LlavaConfig)`
    assert list(parent_types("fast_vlm")) == ["llava"]
    assert inherited_processor_name("fast_vlm") == "LlavaProcessor"
    assert inherited_processor_name("glm_ocr") == "Glm4vProcessor"
    assert list(parent_types("llava")) == []  # no modular source: no parent
    assert inherited_processor_name("llava") is None


@pytest.mark.parametrize(
    ("sections", "total", "expected"),
    [([8, 12, 12], 8, [2, 3, 3]), ([8, 12, 12], 16, [4, 6, 6]), ([16, 24, 24], 5, [3, 1, 1])],
)
def test_sections_scale_to_the_rotary_width(sections, total, expected) -> None:
    assert scaled_sections(sections, total) == expected
    assert sum(expected) == total


class _Rotary(torch.nn.Module):
    def __init__(self, frequencies: int, rope: dict) -> None:
        super().__init__()
        self.config = SimpleNamespace(rope_parameters=rope)
        self.mrope_section = rope.get("mrope_section", [8, 12, 12])
        self.register_buffer("inv_freq", torch.ones(frequencies), persistent=False)


def test_rope_sections_and_rotary_width_are_made_to_agree() -> None:
    wide = _Rotary(64, {"rope_type": "default"})  # 128-wide head, sections of 32
    assert rope_sections_agreed(wide)
    assert wide.config.rope_parameters["partial_rotary_factor"] == 0.5
    narrow = _Rotary(8, {"rope_type": "default", "partial_rotary_factor": 0.5})
    assert rope_sections_agreed(narrow)
    assert narrow.config.rope_parameters["mrope_section"] == [2, 3, 3]
    agreed = _Rotary(32, {"rope_type": "default"})
    assert not rope_sections_agreed(agreed)
    assert "partial_rotary_factor" not in agreed.config.rope_parameters


def test_a_second_tokenizer_is_one_more_part() -> None:
    assert second_tokenizers(InstructBlipProcessor.get_attributes()) == ["qformer_tokenizer"]
    assert second_tokenizers(LlavaProcessor.get_attributes()) == []


def test_images_written_back_to_back_stay_apart() -> None:
    """<img> x x </img><img> x </img>: runs of image and delimiter ids split after a
    closing delimiter (a processor that reports no replacement offsets)."""
    adapter = object.__new__(GenericAdapter)
    adapter.config = SimpleNamespace(image_token_id=5)
    adapter.processor = SimpleNamespace(image_start_token_id=6, image_end_token_id=7)
    adapter.tokenizer = None
    ids = [1, 6, 5, 5, 7, 6, 5, 7, 2]
    assert adapter._spans_from_ids(ids, 2) == [(1, 5), (5, 8)]
    with pytest.raises(ValueError, match="expected 3 runs"):
        adapter._spans_from_ids(ids, 3)


def test_a_diffusion_language_model_is_refused_with_its_reason() -> None:
    from transformers import DiffusionGemmaConfig, LlavaConfig

    from app.models.conventions import refusal

    reason = refusal(DiffusionGemmaConfig())
    assert reason is not None and "diffusion language model" in reason and "canvas" in reason
    assert refusal(LlavaConfig()) is None  # decoded token by token: not refused


def test_the_stand_in_video_processor_learns_the_real_class_defaults() -> None:
    from transformers import Ernie4_5_VLMoeProcessor

    from lad_lab.testing.generic.classes import video_processor_defaults

    defaults = video_processor_defaults(Ernie4_5_VLMoeProcessor)
    assert defaults["font"] == "Roboto-Regular.ttf"  # read from source: no torchvision here
    assert video_processor_defaults(LlavaProcessor) == {}  # no video processor of its own
