"""Tiny random GLM-4V (GLM-4.1V) with a processor built in code.

The real ``Glm4vForConditionalGeneration``: a 2-block vision tower of 14-pixel patches
merged 2 x 2, and a 4-layer GLM-4 decoder (partial rotary over half of head_dim 16, mrope
sections 2/1/1). The image processor is GLM-4V's PIL one with its area range pinned to
``image_pixels``² (56 -> 4 tokens per image; the range counts each image twice, over its
2 temporal patches); the tokenizer is the ranked byte-level one of ``lad_lab.testing.tiny_base``
with GLM's special tokens; the chat template has the released layout: ``[gMASK]<sop>``,
``<|user|>`` turns with each image as ``<|begin_of_image|><|image|><|end_of_image|>``,
``<|assistant|>`` to answer, and GLM-4.5V's empty thinking block when
``enable_thinking`` is false.

``overrides``: hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
intermediate_size, max_position_embeddings, image_pixels, dtype; ``moe=True`` builds
GLM-4.5V (``glm4v_moe``: layer 0 dense, then 4 routed experts, 2 per token, and a shared one).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    Glm4vConfig,
    Glm4vForConditionalGeneration,
    Glm4vMoeConfig,
    Glm4vMoeForConditionalGeneration,
)
from transformers.models.glm4v.image_processing_pil_glm4v import Glm4vImageProcessorPil

from app.models.glm4v import Glm4vProcessorNoVideo
from lad_lab.testing.tiny_base import byte_level_tokenizer

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "[gMASK]",
    "<sop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|video|>",
    "<think>",
    "</think>",
)

CHAT_TEMPLATE = (
    "[gMASK]<sop>{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|begin_of_image|><|image|><|end_of_image|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>\n{% endif %}"
    "{% endif %}"
)


def build(*, seed: int = 0, **overrides: Any) -> tuple[torch.nn.Module, Any]:
    """(model, processor) of a tiny random GLM-4V (GLM-4.5V with ``moe=True``)."""
    moe = bool(overrides.pop("moe", False))
    tokenizer = byte_level_tokenizer(SPECIAL_TOKENS, ranked=True)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    side = int(overrides.pop("image_pixels", 56))
    image_processor = Glm4vImageProcessorPil(
        size={"shortest_edge": 2 * side * side, "longest_edge": 2 * side * side}
    )
    hidden = int(overrides.pop("hidden_size", 64))
    heads = int(overrides.pop("num_attention_heads", 4))
    head_dim = hidden // heads
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden,
        "intermediate_size": int(overrides.pop("intermediate_size", 2 * hidden)),
        "num_hidden_layers": int(overrides.pop("num_hidden_layers", 4)),
        "num_attention_heads": heads,
        "num_key_value_heads": int(overrides.pop("num_key_value_heads", max(1, heads // 2))),
        "max_position_embeddings": int(overrides.pop("max_position_embeddings", 4096)),
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": [head_dim // 8, head_dim // 16, head_dim // 16],
        },
        "eos_token_id": [ids["<|endoftext|>"], ids["<|user|>"]],
        "pad_token_id": ids["<|endoftext|>"],
    }
    if moe:
        text.update(
            n_routed_experts=4,
            n_shared_experts=1,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
        )
    dtype = overrides.pop("dtype", torch.float32)
    if overrides:
        raise TypeError(f"unknown overrides for glm4v: {sorted(overrides)}")
    vision = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "image_size": 56,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": hidden,
    }
    config_cls, model_cls = (
        (Glm4vMoeConfig, Glm4vMoeForConditionalGeneration)
        if moe
        else (Glm4vConfig, Glm4vForConditionalGeneration)
    )
    config = config_cls(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image|>"],
        video_token_id=ids["<|video|>"],
        image_start_token_id=ids["<|begin_of_image|>"],
        image_end_token_id=ids["<|end_of_image|>"],
        video_start_token_id=ids["<|begin_of_video|>"],
        video_end_token_id=ids["<|end_of_video|>"],
    )
    torch.manual_seed(seed)
    model = model_cls(config).to(dtype).eval()
    processor = Glm4vProcessorNoVideo(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE
    )
    return model, processor
