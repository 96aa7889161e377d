"""Tiny random LLaVA-OneVision (SigLIP tower + Qwen2 text) with a processor built in code.

Proves the plumbing of the LLaVA-OneVision adapter without any download: the real
transformers classes, the byte-level tokenizer of ``lad_lab.testing.tiny_base``, the PIL image
processor (no torchvision) and a chat template string. Images are 32x32 pixels cut
into 8x8 patches, so one image of a multi-image prompt costs 16 + 1 (newline) tokens.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    LlavaOnevisionConfig,
    LlavaOnevisionForConditionalGeneration,
    LlavaOnevisionImageProcessorPil,
    SiglipVisionConfig,
)

from app.models.llava_onevision import LlavaOnevisionProcessorNoVideo
from lad_lab.testing.tiny_base import (
    TINY_TOWER,
    byte_level_tokenizer,
    chatml_template,
    seeded_model,
    tiny_text_config,
)

IMAGE_SIZE = 32
PATCH_SIZE = 8

# Images first (one `<image>` each, no delimiters, as in the released template), then text.
CHAT_TEMPLATE = chatml_template(
    "{% for part in message['content'] if part['type'] == 'image' %}<image>{% endfor %}"
    "{% for part in message['content'] if part['type'] == 'text' %}"
    "{{ '\\n' + part['text'] }}{% endfor %}"
)


def build_processor() -> LlavaOnevisionProcessorNoVideo:
    """Processor with one anyres grid resolution, so a lone image is cut into a single tile."""
    tokenizer = byte_level_tokenizer(["<image>", "<video>"])
    image_processor = LlavaOnevisionImageProcessorPil(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        image_grid_pinpoints=[[IMAGE_SIZE, IMAGE_SIZE]],
    )
    return LlavaOnevisionProcessorNoVideo(
        image_processor=image_processor,
        tokenizer=tokenizer,
        num_image_tokens=(IMAGE_SIZE // PATCH_SIZE) ** 2,
        vision_feature_select_strategy="full",
        chat_template=CHAT_TEMPLATE,
        vision_aspect_ratio="anyres_max_9",
    )


def build(
    *, seed: int = 0, **overrides: Any
) -> tuple[torch.nn.Module, LlavaOnevisionProcessorNoVideo]:
    """(model, processor); `dtype` casts the model, other `overrides` go to the Qwen2 config."""
    dtype = overrides.pop("dtype", torch.float32)
    processor = build_processor()
    tokenizer = processor.tokenizer
    vision_config = SiglipVisionConfig(
        **TINY_TOWER,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        vision_use_head=False,
    )
    config = LlavaOnevisionConfig(
        vision_config=vision_config,
        text_config=tiny_text_config(len(tokenizer), **overrides),
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        video_token_index=tokenizer.convert_tokens_to_ids("<video>"),
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        image_grid_pinpoints=[[IMAGE_SIZE, IMAGE_SIZE]],
        vision_aspect_ratio="anyres_max_9",
    )
    model = seeded_model(
        LlavaOnevisionForConditionalGeneration, config, tokenizer, seed=seed, dtype=dtype
    )
    return model, processor
