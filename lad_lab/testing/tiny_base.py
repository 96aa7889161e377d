"""What every tiny build shares: the one byte-level tokenizer, the ChatML chat template, random
images, the small vision tower and decoder of the tower families, and the build's error.

The lowest module of the tiny builds: the families (``lad_lab.testing.families``), the
generic builder (``lad_lab.testing.generic``) and the registry above them
(``lad_lab.testing.tiny_models``) import it; it imports none of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers import Qwen2Config, Qwen2Tokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode


class TinyBuildError(ValueError):
    """This model type has no tiny build; the message names why."""


CHAT_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""The ChatML tokens the default byte-level tokenizer holds first (ids 256, 257, 258)."""


def byte_level_tokenizer(
    special_tokens: Sequence[str],
    named: dict[str, str] | None = None,
    *,
    ranked: bool = False,
) -> Qwen2Tokenizer:
    """A byte-level BPE tokenizer built in code, no files and no merges (transformers'
    ``Qwen2Tokenizer``): the 256 byte symbols, then special tokens, each one token.

    By default the byte symbols take the ids of their byte values (0..255), then come
    :data:`CHAT_TOKENS` and ``special_tokens`` in order (each once); eos is ``<|im_end|>``,
    pad and unk ``<|endoftext|>``, padding on the left; ``named`` become tokenizer
    attributes (``start_image_token``) that some processors read.

    ``ranked=True``: the layout of the GPT-2-style vocabularies the Qwen and GLM families
    release, cut down to their byte symbols: each at its BPE rank (printable bytes first:
    ``!`` is 0, as in the released Qwen vocabulary), then ``special_tokens`` alone, in
    order; eos, pad and unk ``<|endoftext|>``, padding on the right (the Qwen families'
    ``vocab="bytes"`` and GLM-4V's tokenizer; ``named`` is not taken).
    """
    if ranked:
        if named:
            raise TypeError("the ranked byte-level tokenizer takes no named tokens")
        vocab = {symbol: i for i, symbol in enumerate(bytes_to_unicode().values())}
        for token in special_tokens:
            vocab[token] = len(vocab)
        extra = [t for t in special_tokens if t != "<|endoftext|>"]
        return Qwen2Tokenizer(vocab=vocab, merges=[], additional_special_tokens=extra)
    byte_symbols = bytes_to_unicode()
    vocab = {byte_symbols[b]: b for b in range(256)}
    for token in [*CHAT_TOKENS, *special_tokens]:
        vocab.setdefault(token, len(vocab))
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=[],
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        extra_special_tokens=dict(named or {}),
    )
    # Declared special so that they are never split into bytes.
    tokenizer.add_tokens([*CHAT_TOKENS, *special_tokens], special_tokens=True)
    tokenizer.padding_side = "left"
    return tokenizer


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


TINY_TOWER: dict[str, int] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
}
"""Sizes of the 2-layer vision tower every tower family (not the Qwen line) uses."""


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
