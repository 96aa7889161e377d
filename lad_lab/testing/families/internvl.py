"""Tiny random InternVL (transformers-native) with a processor built in code.

The real `InternVLForConditionalGeneration` with a 2-layer InternViT-style tower and
the same tiny Qwen2 decoder as the other families; `GotOcr2ImageProcessorPil` with
tiling disabled (one 32x32 tile per image) so that every image costs
`<img>` + 16 `<IMG_CONTEXT>` + `</img>` = 18 tokens.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    GotOcr2ImageProcessorPil,
    InternVLConfig,
    InternVLForConditionalGeneration,
    InternVLVisionConfig,
)

from app.models.internvl import InternVLProcessorNoVideo
from lad_lab.testing.tiny_base import (
    TINY_TOWER,
    byte_level_tokenizer,
    chatml_template,
    seeded_model,
    tiny_text_config,
)

IMAGE_SIZE = 32
PATCH_SIZE = 4
DOWNSAMPLE_RATIO = 0.5
# tokens per tile after the pixel shuffle: (32/4)^2 * 0.5^2
IMAGE_SEQ_LENGTH = int((IMAGE_SIZE // PATCH_SIZE) ** 2 * DOWNSAMPLE_RATIO**2)

# As the released InternVL-hf templates: each image is `<IMG_CONTEXT>` + newline, then text.
CHAT_TEMPLATE = chatml_template(
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<IMG_CONTEXT>\\n' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}"
)

NAMED_TOKENS = {
    "start_image_token": "<img>",
    "end_image_token": "</img>",
    "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}


def build_processor() -> InternVLProcessorNoVideo:
    """Processor with dynamic tiling off: exactly one tile per image."""
    tokenizer = byte_level_tokenizer(list(NAMED_TOKENS.values()), NAMED_TOKENS)
    image_processor = GotOcr2ImageProcessorPil(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        crop_to_patches=False,
        min_patches=1,
        max_patches=1,
    )
    return InternVLProcessorNoVideo(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_length=IMAGE_SEQ_LENGTH,
        chat_template=CHAT_TEMPLATE,
    )


def build(*, seed: int = 0, **overrides: Any) -> tuple[torch.nn.Module, InternVLProcessorNoVideo]:
    """(model, processor); `dtype` casts the model, other `overrides` go to the Qwen2 config."""
    dtype = overrides.pop("dtype", torch.float32)
    processor = build_processor()
    tokenizer = processor.tokenizer
    vision_config = InternVLVisionConfig(
        **TINY_TOWER,
        image_size=[IMAGE_SIZE, IMAGE_SIZE],
        patch_size=[PATCH_SIZE, PATCH_SIZE],
    )
    config = InternVLConfig(
        vision_config=vision_config,
        text_config=tiny_text_config(len(tokenizer), **overrides),
        image_token_id=processor.image_token_id,
        image_seq_length=IMAGE_SEQ_LENGTH,
        downsample_ratio=DOWNSAMPLE_RATIO,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        tie_word_embeddings=False,
    )
    model = seeded_model(
        InternVLForConditionalGeneration, config, tokenizer, seed=seed, dtype=dtype
    )
    return model, processor
