"""Tiny random Idefics3 and SmolVLM (Idefics3-style tower + Llama decoder), processors in code.

The real `Idefics3ForConditionalGeneration` / `SmolVLMForConditionalGeneration`: 32x32
tiles cut into 8x8 patches and pixel-shuffled by 2, so a tile or the global image
costs 4 `<image>` tokens. Image splitting is on with a longest edge of 64 pixels, so an
image is cut into up to 2 x 2 tiles (fewer for a thin one) plus the global image, and
every span holds row/column markers, newlines and the global image, as in the released
checkpoints (4 x 4 tiles of 364 or 512 pixels).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    Idefics3Config,
    Idefics3ForConditionalGeneration,
    Idefics3ImageProcessorPil,
    Idefics3Processor,
    Idefics3VisionConfig,
    LlamaConfig,
    SmolVLMConfig,
    SmolVLMForConditionalGeneration,
    SmolVLMImageProcessorPil,
    SmolVLMVisionConfig,
)
from transformers.models.smolvlm.processing_smolvlm import DEFAULT_CHAT_TEMPLATE

from app.models.idefics3 import SmolVLMProcessorNoVideo
from lad_lab.testing.tiny_base import TINY_TOWER, byte_level_tokenizer, seeded_model

TILE = 32
PATCH_SIZE = 8
SCALE_FACTOR = 2
IMAGE_SEQ_LEN = (TILE // PATCH_SIZE) ** 2 // SCALE_FACTOR**2
LONGEST_EDGE = 2 * TILE

# Idefics3-8B-Llama3's template: "User:" + `<image>` per image + text, "Assistant:".
IDEFICS3_CHAT_TEMPLATE = (
    "<|begin_of_text|>{% for message in messages %}{{ message['role'].capitalize() }}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<fake_token_around_image>",
    "<image>",
    "<global-img>",
    "<end_of_utterance>",
    "<video>",
    *(f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)),
]
FAMILY_CLASSES = {
    "idefics3": (Idefics3Config, Idefics3VisionConfig, Idefics3ForConditionalGeneration),
    "smolvlm": (SmolVLMConfig, SmolVLMVisionConfig, SmolVLMForConditionalGeneration),
}


def build_processor(family: str = "idefics3") -> Any:
    """The family's processor with image splitting into up to 2 x 2 tiles of 32 pixels."""
    tokenizer = byte_level_tokenizer(SPECIAL_TOKENS)
    tokenizer.eos_token = "<end_of_utterance>"
    image_options = {
        "size": {"longest_edge": LONGEST_EDGE},
        "max_image_size": {"longest_edge": TILE},
        "do_image_splitting": True,
    }
    if family == "smolvlm":
        return SmolVLMProcessorNoVideo(
            image_processor=SmolVLMImageProcessorPil(**image_options),
            tokenizer=tokenizer,
            image_seq_len=IMAGE_SEQ_LEN,
            chat_template=DEFAULT_CHAT_TEMPLATE,
        )
    return Idefics3Processor(
        image_processor=Idefics3ImageProcessorPil(**image_options),
        tokenizer=tokenizer,
        image_seq_len=IMAGE_SEQ_LEN,
        chat_template=IDEFICS3_CHAT_TEMPLATE,
    )


def build(
    family: str = "idefics3", *, seed: int = 0, **overrides: Any
) -> tuple[torch.nn.Module, Any]:
    """(model, processor) of ``family`` ("idefics3" or "smolvlm"); `dtype` casts the model,
    other `overrides` go to the Llama config (`image_pixels` is ignored: the tiles are fixed)."""
    dtype = overrides.pop("dtype", torch.float32)
    overrides.pop("image_pixels", None)
    config_cls, vision_cls, model_cls = FAMILY_CLASSES[family]
    processor = build_processor(family)
    tokenizer = processor.tokenizer
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
    }
    text.update(overrides)
    config = config_cls(
        vision_config=vision_cls(**TINY_TOWER, image_size=TILE, patch_size=PATCH_SIZE),
        text_config=LlamaConfig(**text),
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        scale_factor=SCALE_FACTOR,
        tie_word_embeddings=False,
    )
    model = seeded_model(model_cls, config, tokenizer, seed=seed, dtype=dtype)
    return model, processor
