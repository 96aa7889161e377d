"""Settings a checkpoint saves that a type's default config leaves unset, for the tiny build.

Some default configs do not build a model at all (``CohereCompassConfig()`` has no rope
parameters, ``HunYuanVLTextConfig()`` no head dimension): the checkpoint's ``config.json``
fills them. Each rule below fills one such field by its name, with transformers' own
convention for it, and only where the default leaves it empty; nothing names a family.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PretrainedConfig

_DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 10000.0}
"""transformers' plain rotary embedding (the ``default`` rope type at its usual base)."""
_EXPERT_FIELDS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")


def fill_unset(configs: list[PretrainedConfig], text: PretrainedConfig) -> None:
    """Fill, in place, the settings below where the default leaves them unset."""
    _head_dim(text)
    for sub in configs:
        _rope_per_layer_type(sub)
        _mlp_layer_types(sub)
        _experts_per_token(sub)


def _head_dim(text: PretrainedConfig) -> None:
    """A text config with a ``head_dim`` field left None: hidden size / heads (what the
    config itself assumes where it reads one)."""
    if "head_dim" in vars(text) and vars(text)["head_dim"] is None:  # not a per-layer one
        text.head_dim = int(text.hidden_size) // int(text.num_attention_heads)


def _rope_per_layer_type(config: PretrainedConfig) -> None:
    """Rope parameters keyed by layer type (the model reads ``rope_parameters[kind]``) that
    the default leaves empty: the plain rotary embedding for each kind of ``layer_types``."""
    kinds = getattr(config, "layer_types", None)
    if vars(config).get("rope_parameters") == {} and kinds:
        config.rope_parameters = {kind: dict(_DEFAULT_ROPE) for kind in dict.fromkeys(kinds)}


def _mlp_layer_types(config: PretrainedConfig) -> None:
    """``mlp_layer_types`` left None in a config with routed experts: transformers' default
    for its mixture-of-experts decoders, a first dense layer and sparse ones after it."""
    if "mlp_layer_types" not in vars(config) or config.mlp_layer_types is not None:
        return
    depth = getattr(config, "num_hidden_layers", None)
    if not isinstance(depth, int) or not any(_int(config, key) for key in _EXPERT_FIELDS):
        return
    first = vars(config).get("first_k_dense_replace")
    dense = min(first if isinstance(first, int) else 1, depth)
    config.mlp_layer_types = ["dense"] * dense + ["sparse"] * (depth - dense)


def _experts_per_token(config: PretrainedConfig) -> None:
    """``num_experts_per_tok`` left None in a config with routed experts: top-2 routing
    (the tiny build keeps at most two experts per token anyway)."""
    if "num_experts_per_tok" not in vars(config) or config.num_experts_per_tok is not None:
        return
    if any(_int(config, key) for key in _EXPERT_FIELDS):
        config.num_experts_per_tok = 2


def _int(config: PretrainedConfig, key: str) -> int:
    value: Any = vars(config).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def shrink_channel_lists(configs: list[PretrainedConfig], width: int) -> None:
    """Lists of convolution widths (``downsample_channels``: a tower's stages, its last the
    width the next tower reads) made ``width`` each, like every other width."""
    for sub in configs:
        for key, value in list(vars(sub).items()):
            if not key.endswith("_channels") or not isinstance(value, (list, tuple)):
                continue
            if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                setattr(sub, key, [width] * len(value))


_OPENING = ("start", "begin", "open", "boi")


def processor_delimiters(processor: Any, expanded: set[int]) -> tuple[str, str]:
    """The image delimiters the processor holds as token strings (``image_start_token`` ..
    ``image_end_token``) that its expansion of an image leaves out: a checkpoint's template
    writes those around each placeholder (("", "") unless both are there)."""
    from app.models.conventions import is_delimiter_key

    vocab = processor.tokenizer.get_vocab()
    found = {"start": "", "end": ""}
    for key, value in vars(processor).items():
        if not (key.endswith("_token") and is_delimiter_key(key) and isinstance(value, str)):
            continue
        if value in vocab and vocab[value] not in expanded and "video" not in key:
            side = "start" if any(word in key for word in _OPENING) else "end"
            found[side] = found[side] or value
    return (found["start"], found["end"]) if all(found.values()) else ("", "")


def with_rope_sections(model: torch.nn.Module, text: PretrainedConfig) -> bool:
    """Multi-axis rope sections for a model whose rotary embedding has none (it keeps
    ``mrope_section`` None where its config names none: a checkpoint's does): its rotary
    half-dimension split in three (temporal, height, width), written to ``text``'s rope
    parameters. Whether it wrote them (the model must then be built again)."""
    for module in model.modules():
        if "mrope_section" not in vars(module) or module.mrope_section is not None:
            continue
        inv_freq = getattr(module, "inv_freq", None)
        if not isinstance(inv_freq, torch.Tensor) or not isinstance(text.rope_parameters, dict):
            continue  # an attention module keeping the sections: the rotary one has its width
        half = int(inv_freq.numel())
        text.rope_parameters = {
            **text.rope_parameters,
            "mrope_section": [half - 2 * (half // 3), half // 3, half // 3],
        }
        return True
    return False


CODEBOOK = 32
"""Codes of a tiny discrete (VQ) tokenizer's codebook."""


def lay_out_code_ranges(configs: list[PretrainedConfig], vocabulary: int) -> int:
    """Where codes of discrete image or audio tokenizers enter the text vocabulary at an
    offset (``image_token_offset``: code i is token offset + i), each ``codebook_size`` made
    :data:`CODEBOOK` and the ranges laid out after the tokenizer's ``vocabulary``, in the
    order of the default offsets. The text vocabulary size that holds them all."""
    offsets = sorted(
        (
            (sub, key, value)
            for sub in configs
            for key, value in vars(sub).items()
            if key.endswith("_token_offset")
            and isinstance(value, int)
            and not isinstance(value, bool)
        ),
        key=lambda found: found[2],
    )
    if not offsets:
        return vocabulary
    for sub in configs:
        if isinstance(vars(sub).get("codebook_size"), int):
            sub.codebook_size = CODEBOOK
    for i, (sub, key, _) in enumerate(offsets):
        setattr(sub, key, vocabulary + i * CODEBOOK)
    return vocabulary + len(offsets) * CODEBOOK


CONV_WIDTH = 32
"""Channels of a tiny convolutional tower (a VQ image tokenizer's ResNet stages): one
group of transformers' 32-group norms."""
_CONV_FIELDS = ("base_channels", "latent_channels")


def shrink_conv_towers(configs: list[PretrainedConfig]) -> None:
    """A convolutional tower's base and latent channels made :data:`CONV_WIDTH` and one
    residual block per stage (its stage multipliers, hence its downsampling, kept)."""
    for sub in configs:
        for key in _CONV_FIELDS:
            if _int(sub, key) > CONV_WIDTH:
                setattr(sub, key, CONV_WIDTH)
        if _int(sub, "num_res_blocks") > 1:
            sub.num_res_blocks = 1
