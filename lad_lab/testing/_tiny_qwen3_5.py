"""Tiny random Qwen3.5 (hybrid decoder) with a processor built in code.

The real ``Qwen3_5ForConditionalGeneration``: Qwen3-VL's tiny vision tower (no deepstack)
and a 4-layer decoder whose ``layer_types`` alternate Gated DeltaNet linear attention and
full softmax attention (``full_attention_interval`` 2: layers 1 and 3 are full; the
released checkpoints use 4), partial rotary (half of head_dim 16) with interleaved mrope.
The processor is Qwen3-VL's (``lad_lab.testing._tiny_qwen3_vl``), and the chat template opens
a ``<think>`` block unless ``enable_thinking`` is false, as the released one does.

``overrides``: those of ``_tiny_qwen3_vl`` plus full_attention_interval; ``moe=True``
builds Qwen3.5-MoE (``qwen3_5_moe``: 4 experts, 2 per token, a shared expert) instead.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    Qwen3_5Config,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeConfig,
    Qwen3_5MoeForConditionalGeneration,
)

from app.models.qwen3_vl import Qwen3VLProcessorNoVideo
from lad_lab.testing._tiny_qwen3_vl import (
    MOE_TEXT,
    qwen3_template,
    seeded_model,
    text_config,
    tokenizer_and_image_processor,
)

CHAT_TEMPLATE = qwen3_template(
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}"
)


def build(*, seed: int = 0, **overrides: Any) -> tuple[torch.nn.Module, Any]:
    """(model, processor) of a tiny random Qwen3.5 (Qwen3.5-MoE with ``moe=True``)."""
    moe = bool(overrides.pop("moe", False))
    tokenizer, image_processor, ids = tokenizer_and_image_processor(overrides, vocab="qwen3_5")
    interval = int(overrides.pop("full_attention_interval", 2))
    text = text_config(len(tokenizer), ids, overrides)
    head_dim = text["head_dim"]
    text["full_attention_interval"] = interval  # the config derives layer_types from it
    text["rope_parameters"].update(
        partial_rotary_factor=0.5, mrope_section=[head_dim // 8, head_dim // 16, head_dim // 16]
    )
    text.update(
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
    )
    if moe:  # experts replace the dense MLP
        text.pop("intermediate_size")
        text.update(MOE_TEXT, shared_expert_intermediate_size=32)
    dtype = overrides.pop("dtype", torch.float32)
    if overrides:
        raise TypeError(f"unknown overrides for qwen3_5: {sorted(overrides)}")
    classes = (
        (Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration)
        if moe
        else (Qwen3_5Config, Qwen3_5ForConditionalGeneration)
    )
    model = seeded_model(classes, text, ids, seed, dtype)
    processor = Qwen3VLProcessorNoVideo(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE
    )
    return model, processor
