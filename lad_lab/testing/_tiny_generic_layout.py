"""Layouts of a shrunk config made to agree: rope sections with the heads they rotate,
widths with the layers that take them.

A default config may leave its rope layout to the modeling code (a multi-axis
``mrope_section`` that code defaults to, laid out for a partial rotary factor the default
config does not set) or to a derived field (``head_dim`` set from ``qk_rope_head_dim``
when the config was made), or hold widths that agree only in a checkpoint (a tower
pixel-shuffling its patches into ``intermediate_size`` channels); a checkpoint saves them
agreeing, so the tiny build does too.
"""

from __future__ import annotations

import re
from typing import Any


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
