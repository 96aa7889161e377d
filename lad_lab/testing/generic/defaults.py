"""Settings a checkpoint saves that a type's default config leaves unset or disagreeing, for
the tiny build.

Some default configs do not build a model at all (``CohereCompassConfig()`` has no rope
parameters, ``HunYuanVLTextConfig()`` no head dimension): the checkpoint's ``config.json``
fills them. Each rule below fills one such field by its name, with transformers' own
convention for it, and only where the default leaves it empty; nothing names a family.

The same holds for what the model's code reads and the default does not define or lays out
apart from the model: a field the code reads off the config that its class declares none of
(an omni thinker's ``vision_start_token_id``: :func:`add_read_delimiters`), multi-axis rope
sections the code defaults to, laid out for another rotary width than the tiny head's
(:func:`rope_sections_agreed`), a sliding window no layer uses (:func:`window_no_layer_uses`).
"""

from __future__ import annotations

import inspect
import re
import sys
from typing import Any

import torch
from transformers import PretrainedConfig

from lad_lab.testing.generic.shrink import int_field

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
    if not isinstance(depth, int) or not any(int_field(config, key) for key in _EXPERT_FIELDS):
        return
    first = vars(config).get("first_k_dense_replace")
    dense = min(first if isinstance(first, int) else 1, depth)
    config.mlp_layer_types = ["dense"] * dense + ["sparse"] * (depth - dense)


def _experts_per_token(config: PretrainedConfig) -> None:
    """``num_experts_per_tok`` left None in a config with routed experts: top-2 routing
    (the tiny build keeps at most two experts per token anyway)."""
    if "num_experts_per_tok" not in vars(config) or config.num_experts_per_tok is not None:
        return
    if any(int_field(config, key) for key in _EXPERT_FIELDS):
        config.num_experts_per_tok = 2


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


def rope_sections_agreed(model: torch.nn.Module) -> bool:
    """Make every rotary module's sections cover its frequencies exactly, in its config's
    ``rope_parameters`` (True: something changed, rebuild the model).

    A multi-axis rope splits the rotary frequencies into sections (``mrope_section``:
    temporal, height, width). Some default configs leave the sections to the model code and
    lay out a head dimension whose rotary width does not match them (a checkpoint saves the
    two agreeing: a ``partial_rotary_factor`` of half a 128-wide head for sections of 8 + 12
    + 12). Read from the built rotary modules themselves: where the sections cover fewer
    frequencies than the rotary width has, the factor that narrows it to them; where more
    (the tiny head is narrower than the checkpoint's), the sections scaled down to the width
    in the same proportions."""
    changed = False
    for module in model.modules():
        sections = getattr(module, "mrope_section", None)
        inv_freq = getattr(module, "inv_freq", None)
        rope = getattr(getattr(module, "config", None), "rope_parameters", None)
        if not (isinstance(sections, (list, tuple)) and isinstance(inv_freq, torch.Tensor)):
            continue
        wanted, have = int(sum(sections)), int(inv_freq.shape[-1])
        if wanted == have or not isinstance(rope, dict):
            continue
        if wanted < have and "partial_rotary_factor" not in rope:
            rope["partial_rotary_factor"] = wanted / have
        elif wanted > have >= len(sections):
            rope["mrope_section"] = scaled_sections(list(sections), have)
        else:
            continue
        changed = True
    return changed


def scaled_sections(sections: list[int], total: int) -> list[int]:
    """``sections`` in the same proportions, summing to ``total`` (each at least 1)."""
    scaled = [max(1, s * total // sum(sections)) for s in sections]
    scaled[0] += total - sum(scaled)
    return scaled


_READ_DELIMITER = re.compile(r"config\.((?:image|vision)_(start|end)_token_id)\b")


def delimiters_the_code_reads(model_cls: type) -> list[str]:
    """``vision_start_token_id`` ... fields the model's module reads off a config, each
    opening delimiter with its closing one."""
    try:
        source = inspect.getsource(sys.modules[model_cls.__module__])
    except (OSError, TypeError, KeyError):  # no source to read: nothing learnt
        return []
    names = [m.group(1) for m in _READ_DELIMITER.finditer(source)]
    paired = [n.replace("_start_", "_end_") if "_start_" in n else n for n in names]
    return list(dict.fromkeys(names + paired))


def add_read_delimiters(config: Any, model_cls: type) -> None:
    """The delimiter fields the model reads and neither ``config`` nor its text config
    defines, added to ``config`` (unset: the tokenizer's ids are given later)."""
    text = getattr(config, "text_config", None)
    for name in delimiters_the_code_reads(model_cls):
        if not any(name in vars(owner) for owner in (config, text) if owner is not None):
            setattr(config, name, None)


def window_no_layer_uses(text: PretrainedConfig, window: int) -> None:
    """A text config whose every layer is full attention but whose model builds a sliding
    mask all the same (Step3p7's) gets a window no prompt reaches: a checkpoint names its
    window, a default config leaves it None, and no layer reads it either way."""
    kinds = getattr(text, "layer_types", None)
    if "sliding_window" not in vars(text) or text.sliding_window is not None or not kinds:
        return
    if all(kind == "full_attention" for kind in kinds):
        text.sliding_window = window
