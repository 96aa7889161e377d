"""Tiny random Mistral 3 (Pixtral tower + Mistral decoder) with a processor built in code.

The real `Mistral3ForConditionalGeneration`: 4x4 patches merged 2 x 2, so every 8 x 8
pixels of an image is one `[IMG]` token; the processor resizes the longest edge to at
most 32 pixels, so a square image costs 4 rows of 4 `[IMG]` each closed by `[IMG_BREAK]`,
the last by `[IMG_END]` (20 tokens), a thin one fewer.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    Mistral3Config,
    Mistral3ForConditionalGeneration,
    MistralConfig,
    PixtralImageProcessorPil,
    PixtralVisionConfig,
)

from app.models.mistral3 import PixtralProcessor
from lad_lab.testing.tiny_base import TINY_TOWER, byte_level_tokenizer, seeded_model

PATCH_SIZE = 4
MERGE = 2
LONGEST_EDGE = 32

# As Mistral-Small-3.1's template without its default system prompt: `[INST]` user turn
# with `[IMG]` per image, then the text, `[/INST]`; the answer follows directly.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{{ '[SYSTEM_PROMPT]' + message['content'] + '[/SYSTEM_PROMPT]' }}"
    "{% elif message['role'] == 'user' %}{{ '[INST]' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for block in message['content'] %}"
    "{% if block['type'] == 'text' %}{{ block['text'] }}"
    "{% elif block['type'] in ['image', 'image_url'] %}{{ '[IMG]' }}{% endif %}"
    "{% endfor %}{% endif %}{{ '[/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}"
    "{% endfor %}"
)
SPECIAL_TOKENS = [
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[IMG]",
    "[IMG_BREAK]",
    "[IMG_END]",
]


def build_processor() -> Any:
    tokenizer = byte_level_tokenizer(SPECIAL_TOKENS)
    tokenizer.bos_token, tokenizer.eos_token = "<s>", "</s>"
    return PixtralProcessor(
        image_processor=PixtralImageProcessorPil(
            size={"longest_edge": LONGEST_EDGE},
            patch_size={"height": PATCH_SIZE, "width": PATCH_SIZE},
        ),
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        spatial_merge_size=MERGE,
        chat_template=CHAT_TEMPLATE,
    )


def build(*, seed: int = 0, **overrides: Any) -> tuple[torch.nn.Module, Any]:
    """(model, processor); `dtype` casts the model, other `overrides` go to the Mistral config
    (`image_pixels` sets the longest edge)."""
    dtype = overrides.pop("dtype", torch.float32)
    processor = build_processor()
    side = overrides.pop("image_pixels", None)
    if side is not None:
        processor.image_processor.size = {"longest_edge": int(side)}
    tokenizer = processor.tokenizer
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 2048,
        "sliding_window": None,
        "tie_word_embeddings": False,
    }
    text.update(overrides)
    config = Mistral3Config(
        vision_config=PixtralVisionConfig(
            **TINY_TOWER, image_size=LONGEST_EDGE, patch_size=PATCH_SIZE, head_dim=16
        ),
        text_config=MistralConfig(**text),
        image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"),
        spatial_merge_size=MERGE,
        vision_feature_layer=-1,
        tie_word_embeddings=False,
    )
    model = seeded_model(
        Mistral3ForConditionalGeneration, config, tokenizer, seed=seed, dtype=dtype
    )
    return model, processor
