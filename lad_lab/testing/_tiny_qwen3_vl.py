"""Tiny random Qwen3-VL with a processor built in code.

The real ``Qwen3VLForConditionalGeneration``: a 2-block vision tower of 16-pixel patches
merged 2 x 2 (one deepstack level, added at decoder layer 0), and a 4-layer decoder with
q/k norms and interleaved mrope. The image processor is Qwen2-VL's PIL one with
``patch_size`` 16 and the area pinned to ``image_pixels``² (64 -> 4 tokens per image);
the tokenizer is the released Qwen3 vocabulary with its special-token ids
(``lad_lab.testing.qwen_vocab``; ``vocab="bytes"``: the byte-level one); the chat template is
the released one's layout (no default system turn, images first as
``<|vision_start|><|image_pad|><|vision_end|>``).

``overrides``: hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
intermediate_size, max_position_embeddings, image_pixels, dtype, vocab; ``moe=True`` builds
Qwen3-VL-MoE (``qwen3_vl_moe``: 4 experts, 2 per token) instead.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLMoeConfig,
    Qwen3VLMoeForConditionalGeneration,
)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from app.models.qwen3_vl import Qwen3VLProcessorNoVideo
from lad_lab.testing.qwen_vocab import qwen_tokenizer
from lad_lab.testing.tiny_models import (
    QWEN_SPECIAL_TOKENS,
    _qwen_text_config,
    byte_level_tokenizer,
    qwen_token_ids,
)

PATCH_SIZE = 16
SPECIAL_TOKENS = (*QWEN_SPECIAL_TOKENS, "<think>", "</think>")

_IMAGES_THEN_TEXT = (
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}"
)


def qwen3_template(generation_prompt: str) -> str:
    """ChatML as the Qwen3 line writes it: no default system turn, list-of-parts user
    turns (images first), then ``generation_prompt`` (a Jinja fragment)."""
    return (
        "{% for message in messages %}"
        "<|im_start|>{{ message['role'] }}\n"
        "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
        + _IMAGES_THEN_TEXT
        + "{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n" + generation_prompt + "{% endif %}"
    )


CHAT_TEMPLATE = qwen3_template("")


def text_config(vocab: int, ids: dict[str, int], overrides: dict[str, Any]) -> dict[str, Any]:
    """The tiny Qwen decoder's config with Qwen3's explicit head_dim and interleaved mrope
    (sections 4/2/2 of the 8 frequencies); pops the overrides it uses."""
    text = _qwen_text_config(vocab, ids, overrides)
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    text["head_dim"] = head_dim
    text["rope_parameters"].update(
        mrope_section=[head_dim // 4, head_dim // 8, head_dim // 8], mrope_interleaved=True
    )
    return text


def tokenizer_and_image_processor(
    overrides: dict[str, Any], vocab: str = "qwen3"
) -> tuple[Any, Any, dict[str, int]]:
    """The tokenizer (the released ``vocab``: "qwen3" or "qwen3_5"; "bytes": byte-level), the
    PIL image processor pinned to ``image_pixels``² pixels per image, and the special-token
    ids."""
    vocab = overrides.pop("vocab", vocab)
    tokenizer = byte_level_tokenizer(SPECIAL_TOKENS) if vocab == "bytes" else qwen_tokenizer(vocab)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    side = int(overrides.pop("image_pixels", 64))
    image_processor = Qwen2VLImageProcessorPil(
        patch_size=PATCH_SIZE,
        merge_size=2,
        temporal_patch_size=2,
        min_pixels=side * side,
        max_pixels=side * side,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    return tokenizer, image_processor, ids


def seeded_model(
    classes: tuple[type, type],
    text: dict[str, Any],
    ids: dict[str, int],
    seed: int,
    dtype: torch.dtype,
    **tower: Any,
) -> torch.nn.Module:
    """The (config class, model class) model over the tiny vision tower (plus ``tower``
    settings) and ``text``, seeded, in ``dtype``."""
    config_cls, model_cls = classes
    vision = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": text["hidden_size"],
        "patch_size": PATCH_SIZE,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 64,
        **tower,
    }
    config = config_cls(
        text_config=text,
        vision_config=vision,
        **qwen_token_ids(ids),
    )
    torch.manual_seed(seed)
    return model_cls(config).to(dtype).eval()


MOE_TEXT = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}


def build(*, seed: int = 0, **overrides: Any) -> tuple[torch.nn.Module, Any]:
    """(model, processor) of a tiny random Qwen3-VL (Qwen3-VL-MoE with ``moe=True``)."""
    moe = bool(overrides.pop("moe", False))
    tokenizer, image_processor, ids = tokenizer_and_image_processor(overrides)
    text = text_config(len(tokenizer), ids, overrides)
    if moe:
        text.update(MOE_TEXT)
    dtype = overrides.pop("dtype", torch.float32)
    if overrides:
        raise TypeError(f"unknown overrides for qwen3_vl: {sorted(overrides)}")
    classes = (
        (Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration)
        if moe
        else (Qwen3VLConfig, Qwen3VLForConditionalGeneration)
    )
    model = seeded_model(classes, text, ids, seed, dtype, deepstack_visual_indexes=[0])
    processor = Qwen3VLProcessorNoVideo(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE
    )
    return model, processor
