"""Tiny random Gemma 3 (SigLIP tower + hybrid Gemma 3 decoder) with a processor built in code.

The real `Gemma3ForConditionalGeneration`: 32x32 images cut into 8x8 patches and pooled
to 16 image tokens, so an image costs `<start_of_image>` + 16 `<image_soft_token>` +
`<end_of_image>` (plus the processor's blank lines). The decoder is hybrid like the
released checkpoints, sliding-window layers between global ones, with a window (32
tokens) shorter than any prompt, so that a sliding layer's t_q row really cannot reach
the images: Λ must come from the global layers 2, 5, 7.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3ImageProcessorPil,
    Gemma3Processor,
    Gemma3TextConfig,
    SiglipVisionConfig,
)

from lad_lab.testing.tiny_base import TINY_TOWER, byte_level_tokenizer, seeded_model

IMAGE_SIZE = 32
PATCH_SIZE = 8
IMAGE_SEQ_LENGTH = 16  # (32 / 8)^2 patches, pooled with kernel 1
SLIDING_WINDOW = 32
S, F = "sliding_attention", "full_attention"
LAYER_TYPES = [S, S, F, S, S, F, S, F]

# As the released template: a system turn is folded into the first user turn, text parts
# are trimmed, images are `<start_of_image>`, the model's turn is "model".
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}"
    "{% set first_user_prefix = messages[0]['content'] + '\\n\\n' %}"
    "{% set loop_messages = messages[1:] %}"
    "{% else %}{% set first_user_prefix = '' %}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') }}"
    "{% if message['content'] is string %}{{ message['content'] | trim }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}{{ '<start_of_image>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] | trim }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<end_of_turn>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)

NAMED_TOKENS = {
    "boi_token": "<start_of_image>",
    "eoi_token": "<end_of_image>",
    "image_token": "<image_soft_token>",
}


def build_processor() -> Gemma3Processor:
    """Byte-level tokenizer with Gemma's turn and image tokens; pan-and-scan off."""
    specials = [*NAMED_TOKENS.values(), "<start_of_turn>", "<end_of_turn>", "<bos>"]
    tokenizer = byte_level_tokenizer(specials, NAMED_TOKENS)
    tokenizer.bos_token = "<bos>"
    image_processor = Gemma3ImageProcessorPil(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, do_pan_and_scan=False
    )
    return Gemma3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
        image_seq_length=IMAGE_SEQ_LENGTH,
    )


def build(*, seed: int = 0, **overrides: Any) -> tuple[torch.nn.Module, Gemma3Processor]:
    """(model, processor); `dtype` casts the model, other `overrides` go to the text config
    (`image_pixels` is ignored: Gemma 3 resizes every image to the tower's square)."""
    dtype = overrides.pop("dtype", torch.float32)
    overrides.pop("image_pixels", None)
    processor = build_processor()
    tokenizer = processor.tokenizer
    layers = int(overrides.pop("num_hidden_layers", len(LAYER_TYPES)))
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "max_position_embeddings": 2048,
        "sliding_window": SLIDING_WINDOW,
        "layer_types": [LAYER_TYPES[i % len(LAYER_TYPES)] for i in range(layers)],
        "bos_token_id": tokenizer.bos_token_id,
    }
    text.update(overrides)
    config = Gemma3Config(
        text_config=Gemma3TextConfig(**text),
        vision_config=SiglipVisionConfig(
            **TINY_TOWER, image_size=IMAGE_SIZE, patch_size=PATCH_SIZE, vision_use_head=False
        ),
        mm_tokens_per_image=IMAGE_SEQ_LENGTH,
        boi_token_index=tokenizer.boi_token_id,
        eoi_token_index=tokenizer.convert_tokens_to_ids(tokenizer.eoi_token),
        image_token_index=tokenizer.image_token_id,
        tie_word_embeddings=False,
    )
    model = seeded_model(Gemma3ForConditionalGeneration, config, tokenizer, seed=seed, dtype=dtype)
    return model, processor
