"""A default config shrunk to a tiny one by field name: every width, depth, head count and
expert count of the config and its sub-configs, and the layouts that follow the new widths.

No family is named: the fields are found by the names transformers' configs give them
(``hidden_size``, ``num_hidden_layers``, ``num_key_value_heads`` ...), so a new type of the
image-text-to-text mapping shrinks without being told; per-layer settings and lists of layer
indices follow the new depth, as a checkpoint of that depth would hold them. Convolution
widths (a tower's ``downsample_channels``, a VQ tokenizer's ResNet stages) shrink too, and
the codes of a discrete image tokenizer are laid out after the tiny vocabulary.

A default config may leave its rope layout to a derived field (``head_dim`` set from
``qk_rope_head_dim`` when the config was made), or hold widths that agree only in a
checkpoint (a tower pixel-shuffling its patches into ``intermediate_size`` channels); a
checkpoint saves them agreeing, so the shrunk config does too (the helpers at the end).
"""

from __future__ import annotations

import re
from typing import Any

from transformers import PretrainedConfig

HEADS, KV_HEADS = 2, 1
"""Attention heads of every tower. Head dimensions keep their defaults (rope sections,
partial rotary factors and the like are laid out for them); every hidden width becomes
HEADS x the text model's head dimension, text and vision alike, so projections agree."""
TEXT_LAYERS, VISION_LAYERS = 4, 2
EXPERTS, EXPERTS_PER_TOKEN = 4, 2
_ONE_EACH = ("n_shared_experts", "num_shared_experts", "n_group", "topk_group")

_WIDTHS = re.compile(
    r"^(hidden_size|d_model|embed_dim|n_embd|width|hidden_dim|dim|projection_dim"
    r"|out_hidden_size|projector_hidden_size|projection_hidden_size|text_hidden_size|vision_hidden_size"
    r"|proj_dim|mm_hidden_size|output_dim|codebook_dim"
    r"|vision_output_dim|projector_input_dim|projector_output_dim)$"
)
_INTERMEDIATE = re.compile(r"intermediate_size|ffn_dim|mlp_dim|ffn_hidden_size|n_inner")
_DEPTHS = re.compile(r"^(num_hidden_layers|num_layers|depth|n_layer|n_layers|encoder_layers)$")
_HEAD_COUNTS = re.compile(
    r"^(num_attention_heads|num_heads|n_head|n_heads|attention_heads|encoder_attention_heads"
    r"|linear_num_heads|index_n_heads)$"
)
_KV_COUNTS = re.compile(r"^(num_key_value_heads|num_kv_heads|n_kv_heads)$")
_EXPERT_COUNTS = re.compile(r"^(num_experts|n_routed_experts|num_local_experts|moe_num_experts)$")
_EXPERT_TOPK = re.compile(r"^(num_experts_per_tok|moe_topk|top_k|moe_k|num_experts_per_token)$")
_LAYER_LISTS = re.compile(r"(indexes|indices|_layers|layer_ids)$")
_MLA = {
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
}


def config_tree(config: PretrainedConfig) -> list[PretrainedConfig]:
    """``config`` and every sub-config under it, depth first (what the shrink walks)."""
    found = [config]
    for value in vars(config).values():
        if isinstance(value, PretrainedConfig):
            found.extend(config_tree(value))
    return found


def text_head_dim(config: PretrainedConfig) -> int:
    """The text model's head dimension, as the default config lays it out."""
    text = config.get_text_config()
    try:
        head_dim = getattr(text, "head_dim", None)
    except Exception:  # a per-layer attribute (it varies across layers): the layers' widths
        head_dim = None
    if isinstance(head_dim, int) and head_dim > 0:
        return head_dim
    hidden, heads = int(text.hidden_size), int(text.num_attention_heads)
    if hidden % heads:  # a default whose width does not divide among its heads
        return next_power_of_two(hidden // heads)
    return hidden // heads


def shrink(config: PretrainedConfig) -> None:
    """Every width, depth, head count and expert count of ``config`` and its sub-configs
    made tiny, in place, by field name (layer-index lists and ``layer_types`` cut to the
    new depth, a hybrid decoder keeping at least one full-attention layer)."""
    width = HEADS * text_head_dim(config)
    text = getattr(config, "text_config", None)
    merged = merged_widths(config_tree(config), text)
    for sub in config_tree(config):
        is_text = sub is text or (text is None and sub is config)
        depth = TEXT_LAYERS if is_text else VISION_LAYERS
        old_depth = None
        heads, kv_heads = _first(sub, _HEAD_COUNTS), _first(sub, _KV_COUNTS)
        old_rope_dim = vars(sub).get("qk_rope_head_dim")
        for key, value in list(vars(sub).items()):
            if isinstance(value, bool) or key.startswith("_"):
                continue
            if isinstance(value, int):
                if _WIDTHS.match(key):  # a merged tower's width stays that multiple
                    merges = merged.get(value, 1) if sub is not text and key != "hidden_size" else 1
                    setattr(sub, key, width * merges)
                elif _INTERMEDIATE.search(key):
                    setattr(sub, key, 2 * width if "moe" not in key else width)
                elif _DEPTHS.match(key):
                    old_depth = old_depth or value
                    setattr(sub, key, depth)
                elif _HEAD_COUNTS.match(key):
                    setattr(sub, key, HEADS)
                elif _KV_COUNTS.match(key):  # multi-head attention stays multi-head
                    setattr(sub, key, HEADS if value == heads else KV_HEADS)
                elif _EXPERT_COUNTS.match(key):
                    setattr(sub, key, EXPERTS)
                elif _EXPERT_TOPK.match(key):
                    setattr(sub, key, min(value, EXPERTS_PER_TOKEN))
                elif key in _MLA and value:
                    setattr(sub, key, _MLA[key])
                elif key in _ONE_EACH and (value or key in ("n_group", "topk_group")):
                    setattr(sub, key, 1)
                elif key == "first_k_dense_replace":
                    setattr(sub, key, min(value, 1))
        derived_head_dim(sub, old_rope_dim)
        shuffled_widths(sub, width)
        _heads_for_head_dim(sub, width, keep_mha=heads is not None and heads == kv_heads)
        new_depth = getattr(sub, "num_hidden_layers", None) or getattr(sub, "depth", None)
        if isinstance(new_depth, int):
            _cut_layer_lists(sub, new_depth, old_depth)
        layer_ids_inside(sub, new_depth if isinstance(new_depth, int) else VISION_LAYERS)
        _pick_feature_layers(sub)


def _first(config: PretrainedConfig, pattern: re.Pattern[str]) -> int | None:
    """The first int field of ``config`` whose name matches ``pattern``."""
    for key, value in vars(config).items():
        if pattern.match(key) and isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


_FEATURE_LAYERS = re.compile(r"feature_layers?$")


def _pick_feature_layers(config: PretrainedConfig) -> None:
    """Vision layers a projector reads (``vision_feature_layer``: 24 or [24, 18]) moved
    inside the shrunk tower, distinct and in the same order of depth (deepest stays last
    layer, the next the one before ...)."""
    for key, value in list(vars(config).items()):
        if not _FEATURE_LAYERS.search(key) or isinstance(value, bool):
            continue
        values = [value] if isinstance(value, int) else value
        if not isinstance(values, (list, tuple)) or not all(isinstance(v, int) for v in values):
            continue
        if all(-VISION_LAYERS <= v < VISION_LAYERS for v in values):
            continue
        rank = {v: i for i, v in enumerate(sorted({v for v in values if v >= 0}, reverse=True))}
        picked = [
            max(v, -VISION_LAYERS) if v < 0 else max(VISION_LAYERS - 1 - rank[v], 0) for v in values
        ]
        setattr(config, key, picked[0] if isinstance(value, int) else picked)


def _heads_for_head_dim(config: PretrainedConfig, width: int, keep_mha: bool = False) -> None:
    """A tower whose head dimension is a field of its own keeps heads x head_dim = width."""
    head_dim = vars(config).get("head_dim")
    if not isinstance(head_dim, int) or head_dim <= 0 or width % head_dim:
        return
    heads = max(1, width // head_dim)
    for key, value in list(vars(config).items()):
        if _HEAD_COUNTS.match(key):
            setattr(config, key, heads)
        elif _KV_COUNTS.match(key) and isinstance(value, int):
            setattr(config, key, heads if keep_mha else min(KV_HEADS, heads))


def _cut_layer_lists(config: PretrainedConfig, depth: int, old_depth: int | None = None) -> None:
    """Per-layer settings cut to ``depth`` (lists per layer, dicts keyed by layer index) and
    lists of layer indices kept inside it. Layer i keeps layer i's settings, but for the
    last, which takes the first full-attention layer's where a hybrid decoder's first
    ``depth`` layers hold none (Λ needs one)."""
    kinds = getattr(config, "layer_types", None)
    sources = list(range(depth))
    if isinstance(kinds, list) and kinds:
        sources = [min(i, len(kinds) - 1) for i in range(depth)]
        if "full_attention" in kinds and "full_attention" not in kinds[:depth]:
            sources[-1] = kinds.index("full_attention")
        config.layer_types = [kinds[i] for i in sources]
    for key, value in list(vars(config).items()):
        if key == "layer_types" or not value:
            continue
        if isinstance(value, (list, tuple)) and old_depth and len(value) == old_depth > depth:
            setattr(config, key, [value[i] for i in sources])  # one entry per layer
        elif isinstance(value, dict) and all(str(k).isdigit() for k in value):
            picked = {i: value.get(src, value.get(str(src))) for i, src in enumerate(sources)}
            setattr(config, key, {i: v for i, v in picked.items() if v is not None})
        elif isinstance(value, (list, tuple)) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            if _LAYER_LISTS.search(key):
                kept = sorted({v if v < 0 else min(v, depth - 1) for v in value})
                setattr(config, key, kept)
            elif len(value) > depth and key in ("no_rope_layers", "mlp_layer_types", "moe_layers"):
                setattr(config, key, [value[i] for i in sources])


def int_field(config: PretrainedConfig, key: str) -> int:
    """``config``'s own int field ``key`` (0 where it has none, or a bool)."""
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
            if int_field(sub, key) > CONV_WIDTH:
                setattr(sub, key, CONV_WIDTH)
        if int_field(sub, "num_res_blocks") > 1:
            sub.num_res_blocks = 1


def next_power_of_two(value: int) -> int:
    """The least power of two >= ``value`` (head dimensions of real checkpoints are)."""
    return 1 << max(0, int(value) - 1).bit_length()


def derived_head_dim(config: Any, old_rope_dim: Any) -> None:
    """A multi-head latent attention config's ``head_dim`` (the rotary part's width, derived
    from ``qk_rope_head_dim`` when the config was made) and ``qk_head_dim`` follow the
    shrunk ``qk_rope_head_dim``."""
    fields = vars(config)
    rope_dim = fields.get("qk_rope_head_dim")
    if not isinstance(rope_dim, int) or not isinstance(old_rope_dim, int):
        return
    if fields.get("head_dim") == old_rope_dim:
        config.head_dim = rope_dim
    if isinstance(fields.get("qk_head_dim"), int) and isinstance(
        fields.get("qk_nope_head_dim"), int
    ):
        config.qk_head_dim = config.qk_nope_head_dim + rope_dim


def shuffled_widths(config: Any, width: int) -> None:
    """A tower that pixel-shuffles its patches by ``pixel_shuffle_ratio`` r turns each
    ``width``-wide feature into width / r² channels, which the layer after it takes as
    ``intermediate_size``: that width, so the shuffled features fit it."""
    ratio = vars(config).get("pixel_shuffle_ratio")
    if not isinstance(ratio, float) or not 0 < ratio < 1:
        return
    shuffled = round(width / ratio**2)
    if isinstance(vars(config).get("intermediate_size"), int):
        config.intermediate_size = shuffled


_MERGES = ("merge_size", "spatial_merge_size")


def merged_widths(configs: list[Any], text: Any) -> dict[int, int]:
    """Default widths of merged vision features: a tower of width h merging m x m patches
    gives h·m² channels, which a field elsewhere (``out_hidden_size``) may hold as a number
    of its own. {h·m²: m²} over the towers of ``configs`` (the text config left out)."""
    found: dict[int, int] = {}
    for config in configs:
        if config is text:
            continue
        fields = vars(config)
        hidden = fields.get("hidden_size")
        for key in _MERGES:
            merge = fields.get(key)
            if isinstance(hidden, int) and isinstance(merge, int) and merge > 1:
                found[hidden * merge * merge] = merge * merge
    return found


_LAYER_ID = re.compile(r"_layer_(id|idx|index)$")


def layer_ids_inside(config: Any, depth: int) -> None:
    """A single layer index (``insert_layer_id``: the layer after which a tower merges its
    patches) kept inside the shrunk depth; past it the layer would never be reached while
    the code after the tower still counts on it."""
    for key, value in list(vars(config).items()):
        is_index = isinstance(value, int) and not isinstance(value, bool)
        if _LAYER_ID.search(key) and is_index and value >= depth:
            setattr(config, key, depth - 1)
