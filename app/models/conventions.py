"""What a transformers config says about its images and layers, read by convention.

The generic adapter (``app.models.generic``), the registry's load-time refusal and the tiny
builds (``lad_lab.testing``) read a config the same way, here: the image placeholder's id, the
delimiter fields around an image, why a config cannot be served, and which layers are
whole-prompt softmax layers (Λ's candidates). Nothing here names a family.
"""

from __future__ import annotations

import re
from typing import Any

IMAGE_TOKEN_KEYS = ("image_token_id", "image_token_index")
"""Config fields holding the id of the image placeholder token."""
_DELIMITER_KEY = re.compile(
    r"^(boi|eoi|(image|vision|img)_?(start|end|begin|open|close))_token(_id|_index)?$"
)
_FULL_ATTENTION = "full_attention"
_INDEXED = "indexed_attention"


def image_token_id(config: Any) -> int | None:
    """The config's image placeholder token id (top level, then the text config)."""
    for owner in (config, getattr(config, "text_config", None)):
        for key in IMAGE_TOKEN_KEYS:
            value = getattr(owner, key, None)
            if isinstance(value, int):
                return value
    return None


def _names_image_token(config: Any) -> bool:
    """Whether the config has an image token field at all (a default config may leave it
    None for the checkpoint to fill)."""
    owners = (config, getattr(config, "text_config", None))
    return any(
        hasattr(owner, key) for owner in owners if owner is not None for key in IMAGE_TOKEN_KEYS
    )


def refusal(config: Any) -> str | None:
    """Why the generic adapter cannot serve ``config`` (None: it can)."""
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder model: the images are not tokens of the decoder's sequence"
    text = getattr(config, "text_config", None) or config
    if getattr(text, "cross_attention_layers", None) or getattr(
        config, "cross_attention_layers", None
    ):
        return (
            "image features reach the text through cross-attention layers, not as tokens of "
            "the sequence (no image span to read attention over)"
        )
    if getattr(config, "canvas_length", None):
        return (
            "a diffusion language model: the answer is denoised on a canvas of "
            f"{config.canvas_length} tokens that reads the prompt's cache, not decoded token "
            "by token after the prompt (no next-token label scores to read)"
        )
    if not _names_image_token(config):
        return (
            "no image tokens in the sequence: the config names no image_token_id / "
            "image_token_index"
        )
    if _one_query_run_per_prompt(config):
        return (
            "one image per prompt: a Q-Former's num_query_tokens query tokens stand for the "
            "image, written once ahead of the text whatever the number of images, so the N "
            "images of a prompt cannot each have a span"
        )
    kinds = layer_kinds(text) if hasattr(text, "num_hidden_layers") else None
    if kinds is not None and not full_attention_layers(text):
        return (
            "no layer of layer_types is full_attention (it has "
            f"{', '.join(sorted(set(kinds)))}), so Λ (whole-prompt softmax layers) is empty"
        )
    return None


def _one_query_run_per_prompt(config: Any) -> bool:
    """A Q-Former model (BLIP-2, InstructBLIP): its processor writes ``num_query_tokens``
    image tokens once at the head of each prompt, however many images it is given."""
    queries = getattr(config, "num_query_tokens", None)
    has_qformer = getattr(config, "qformer_config", None) is not None
    return has_qformer and isinstance(queries, int) and not isinstance(queries, bool)


def is_delimiter_key(key: str) -> bool:
    """``vision_start_token_id``, ``image_end_token``, ``boi_token_index`` ... (config or
    processor fields naming an image's opening or closing token)."""
    return _DELIMITER_KEY.match(key) is not None


def layer_kinds(text_config: Any) -> list[str] | None:
    """``layer_types`` of a text config, cut to its depth (None when it has none)."""
    kinds = getattr(text_config, "layer_types", None)
    if not kinds:
        return None
    return list(kinds)[: int(text_config.num_hidden_layers)]


def full_attention_layers(text_config: Any) -> tuple[int, ...]:
    """Layers whose softmax attention sees the whole prompt: the ``full_attention`` ones of
    ``layer_types`` (sliding layers too when the config has no window); all without it."""
    depth = int(text_config.num_hidden_layers)
    kinds = layer_kinds(text_config)
    if kinds is None:
        return tuple(range(depth))
    no_window = getattr(text_config, "sliding_window", None) is None
    indexed = index_topk(text_config) is not None
    return tuple(
        i
        for i, kind in enumerate(kinds)
        if kind == _FULL_ATTENTION
        or (no_window and kind == "sliding_attention")
        or (indexed and kind == _INDEXED)
    )


def index_topk(text_config: Any) -> int | None:
    """Keys an ``indexed_attention`` layer keeps per query (``index_topk``, DeepSeek-style
    sparse attention): its indexer picks the top k of the keys a query may see, so a
    sequence of at most k tokens keeps every key and the layer is full attention. None
    where the config names no such k."""
    kinds = layer_kinds(text_config) or []
    topk = getattr(text_config, "index_topk", None)
    if _INDEXED not in kinds or not isinstance(topk, int) or isinstance(topk, bool) or topk < 1:
        return None
    return topk
