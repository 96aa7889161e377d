"""Settings a checkpoint saves that a type's default config leaves unset, for the tiny build.

Some default configs do not build a model at all (``CohereCompassConfig()`` has no rope
parameters, ``HunYuanVLTextConfig()`` no head dimension): the checkpoint's ``config.json``
fills them. Each rule below fills one such field by its name, with transformers' own
convention for it, and only where the default leaves it empty; nothing names a family.
"""

from __future__ import annotations

from typing import Any

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
    if "head_dim" in vars(text) and text.head_dim is None:
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
