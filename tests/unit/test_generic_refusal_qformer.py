"""Refusal of Q-Former models (BLIP-2, InstructBLIP): one image's query tokens per prompt."""

from __future__ import annotations

from transformers import Blip2Config, InstructBlipConfig, LlavaConfig

from app.models.conventions import refusal
from lad_lab.testing.generic.processor import build_processor
from lad_lab.testing.generic.shrink import shrink
from lad_lab.testing.tiny_models import random_images


def test_q_former_models_are_refused_as_one_image_per_prompt() -> None:
    for config in (Blip2Config(), InstructBlipConfig()):
        assert "one image per prompt" in refusal(config)
    # the query count alone (no Q-Former) is not the rule
    llava = LlavaConfig()
    llava.num_query_tokens = 32
    assert refusal(llava) is None


def test_the_reason_holds_the_processor_writes_one_run_for_three_images() -> None:
    config = Blip2Config()
    shrink(config)
    processor = build_processor("blip-2", config)
    image_id = processor.tokenizer.convert_tokens_to_ids(processor.image_token.content)
    out = processor(text=["three images"], images=random_images(3, seed=0, sizes=[(64, 64)]))
    ids = list(out["input_ids"][0])
    assert ids.count(image_id) == config.num_query_tokens  # not 3 x num_query_tokens
    assert ids[: config.num_query_tokens] == [image_id] * config.num_query_tokens
