"""Tiny random LLaVA-OneVision (SigLIP tower + Qwen2 text) with a processor built in code.

Proves the plumbing of the LLaVA-OneVision adapter without any download: the real
transformers classes, a byte-level Qwen2 tokenizer with no files, the PIL image
processor (no torchvision) and a chat template string. Images are 32x32 pixels cut
into 8x8 patches, so one image of a multi-image prompt costs 16 + 1 (newline) tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import (
    LlavaOnevisionConfig,
    LlavaOnevisionForConditionalGeneration,
    LlavaOnevisionImageProcessorPil,
    Qwen2Config,
    Qwen2Tokenizer,
    SiglipVisionConfig,
)
from transformers.convert_slow_tokenizer import bytes_to_unicode

from app.models.llava_onevision import LlavaOnevisionProcessorNoVideo
from lad_lab.testing.tiny_models import chatml_template

IMAGE_SIZE = 32
PATCH_SIZE = 8

# Images first (one `<image>` each, no delimiters, as in the released template), then text.
CHAT_TEMPLATE = chatml_template(
    "{% for part in message['content'] if part['type'] == 'image' %}<image>{% endfor %}"
    "{% for part in message['content'] if part['type'] == 'text' %}"
    "{{ '\\n' + part['text'] }}{% endfor %}"
)


def byte_level_tokenizer(
    special_tokens: Sequence[str], named_special_tokens: dict[str, str] | None = None
) -> Qwen2Tokenizer:
    """A Qwen2 tokenizer with the 256 byte symbols, no merges and the given special tokens.

    Ids 0..255 are the bytes, then `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` and the
    family's tokens in order. `named_special_tokens` become tokenizer attributes
    (e.g. `start_image_token`), which some processors read.
    """
    byte_symbols = bytes_to_unicode()
    vocab = {byte_symbols[b]: b for b in range(256)}
    base = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    for token in [*base, *special_tokens]:
        vocab.setdefault(token, len(vocab))
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=[],
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        extra_special_tokens=dict(named_special_tokens or {}),
    )
    # Declared special so that they are never split into bytes.
    tokenizer.add_tokens([*base, *special_tokens], special_tokens=True)
    tokenizer.padding_side = "left"
    return tokenizer


# Sizes of the 2-layer vision tower every non-Qwen tiny family uses.
TINY_TOWER: dict[str, int] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
}


def tiny_text_config(vocab_size: int, **overrides: Any) -> Qwen2Config:
    """Qwen2 decoder: hidden 64, 4 layers, 4 query heads over 2 KV heads (GQA), 2048 context."""
    settings: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    }
    settings.update(overrides)
    return Qwen2Config(**settings)


def seeded_model(
    model_cls: type[torch.nn.Module], config: Any, tokenizer: Any, *, seed: int, dtype: torch.dtype
) -> torch.nn.Module:
    """The tiny model in eval mode, its decoder ending and padding with the tokenizer's tokens."""
    config.text_config.eos_token_id = tokenizer.eos_token_id
    config.text_config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(seed)
    return model_cls(config).to(dtype).eval()


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
