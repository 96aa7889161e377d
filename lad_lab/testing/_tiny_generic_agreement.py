"""Settings of a tiny build that a checkpoint saves agreeing and a default config need not.

The generic tiny builder (``lad_lab.testing._tiny_generic``) shrinks the type's own default
config and builds its own processor; where the two count an image differently (a tile side,
a fixed token count, a patch side under another name) or the model reads a setting the
default leaves unset, these make them agree, from the fields and defaults of the config and
the processor alone (no family is named).
"""

from __future__ import annotations

import inspect
import math
from typing import Any

from transformers import PretrainedConfig


def window_no_layer_uses(text: PretrainedConfig, window: int) -> None:
    """A text config whose every layer is full attention but whose model builds a sliding
    mask all the same (Step3p7's) gets a window no prompt reaches: a checkpoint names its
    window, a default config leaves it None, and no layer reads it either way."""
    kinds = getattr(text, "layer_types", None)
    if "sliding_window" not in vars(text) or text.sliding_window is not None or not kinds:
        return
    if all(kind == "full_attention" for kind in kinds):
        text.sliding_window = window


def vit_patch_key(image_processor: Any) -> str:
    """The image processor's field for the tower's patch side: ``vision_patch_size`` where
    it has one (its ``patch_size`` is then a crop's side, Step3p7's 504), else ``patch_size``."""
    return "vision_patch_size" if hasattr(image_processor, "vision_patch_size") else "patch_size"


def tower_size_from_processor(processor_cls: type, config: PretrainedConfig) -> None:
    """Where the processor counts an image's tokens for a tile side of its own (Aya Vision's
    ``img_size``), the vision tower takes that side: a checkpoint saves the two agreeing,
    and a default config need not (its tower's patch grid may not even fit the merge)."""
    vision = getattr(config, "vision_config", None)
    if not isinstance(getattr(vision, "image_size", None), int):
        return
    params = inspect.signature(processor_cls.__init__).parameters
    for name in ("img_size", "image_size"):
        param = params.get(name)
        if param is not None and isinstance(param.default, int) and param.default > 0:
            vision.image_size = param.default
            return
    _tower_side_from_token_count(params.get("num_image_tokens"), vision)


def _tower_side_from_token_count(param: inspect.Parameter | None, vision: Any) -> None:
    """A processor writing a fixed ``num_image_tokens`` per image (DeepSeek-VL's 576) counts
    the tower's square patch grid: the tower takes the side of that grid."""
    count = getattr(param, "default", None)
    patch = getattr(vision, "patch_size", None)
    if not isinstance(count, int) or count <= 0 or not isinstance(patch, int):
        return
    grid = math.isqrt(count)
    if grid * grid == count:
        vision.image_size = grid * patch


def patch_queries_for_tower(config: PretrainedConfig, processor: Any) -> None:
    """A projector that maps each image's patch count to its number of query tokens
    (``projector_patch_to_query_dict``, keyed by patch counts) re-keyed for the tower's own
    patch grid, from the processor's side -> query-count table (``size_conversion``): the
    default dict counts a tower of another patch size than the default tower's."""
    table = getattr(processor, "size_conversion", None)
    vision = getattr(config, "vision_config", None)
    patch = getattr(vision, "patch_size", None)
    if not isinstance(table, dict) or not isinstance(patch, int) or patch <= 0:
        return
    for key, value in list(vars(config).items()):
        if key.endswith("patch_to_query_dict") and isinstance(value, dict):
            setattr(config, key, {(int(side) // patch) ** 2: q for side, q in table.items()})
