"""A tiny random instance of any model type of transformers' image-text-to-text mapping.

Nothing here knows a family. The model is the type's own config class with every width,
depth, expert count and vocabulary shrunk by walking the config's fields (and its
sub-configs) by name; the processor is the type's own processor class built in code: its
PIL image processor with image splitting turned off, a byte-level tokenizer carrying every
special token the processor asks its tokenizer for, and a ChatML chat template writing the
processor's own image placeholder where the processor ships none. Spatial settings (image
size, patch size, merges) keep their defaults, so the processor's token counts and the
vision tower agree without being told.

A type that cannot be served (``app.models.conventions.refusal``) or whose processor cannot be
built here raises :class:`~lad_lab.testing.tiny_base.TinyBuildError` naming why.

This module runs the steps, each a module of this package, and builds the model:

- ``shrink``: every width, depth, head and expert count made tiny by field name;
- ``defaults``: what a checkpoint's config sets and the default leaves unset or disagreeing;
- ``classes``: the classes the type's processor is made of, and its image processor;
- ``tokens``: the tiny tokenizer's special tokens and the config's token ids;
- ``processor``: the processor built in code, agreeing with the tower;
- ``images``: smaller images where the type's own settings allow.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers
from transformers import PretrainedConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

from app.models.conventions import refusal
from lad_lab.testing.generic import images as _images
from lad_lab.testing.generic.classes import image_processor_for, processor_class_for
from lad_lab.testing.generic.defaults import (
    add_read_delimiters,
    fill_unset,
    rope_sections_agreed,
    window_no_layer_uses,
    with_rope_sections,
)
from lad_lab.testing.generic.processor import build_processor, patch_queries_for_tower
from lad_lab.testing.generic.shrink import (
    HEADS,
    config_tree,
    lay_out_code_ranges,
    shrink,
    shrink_channel_lists,
    shrink_conv_towers,
    text_head_dim,
)
from lad_lab.testing.generic.tokens import (
    image_token_from_expansion,
    placeholder_of,
    probe_image,
    set_token_ids,
)
from lad_lab.testing.tiny_base import TinyBuildError

CONTEXT = 8192
"""Least context of a tiny text model: five images at the tower's own size fit."""


def image_text_types() -> tuple[str, ...]:
    """Every model type of transformers' image-text-to-text mapping."""
    return tuple(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)


def build(
    model_type: str, *, seed: int = 0, dtype: torch.dtype = torch.float32, small_images: bool = True
) -> tuple[Any, Any]:
    """(model, processor) of ``model_type``, random and tiny; TinyBuildError where it cannot.
    ``small_images``: smaller images where the type's own settings allow
    (``lad_lab.testing.generic.images``; False: the tower's default image size)."""
    if model_type not in CONFIG_MAPPING:
        raise TinyBuildError(f"{model_type!r} is not a model type of transformers")
    config = CONFIG_MAPPING[model_type]()
    reason = refusal(config)
    if reason is not None:
        raise TinyBuildError(f"{model_type}: {reason}")
    for key, sub_cls in (getattr(config, "sub_configs", None) or {}).items():
        if "vision" in key and getattr(config, key, False) is None:  # a checkpoint has one
            setattr(config, key, sub_cls())
    fill_unset(config_tree(config), config.get_text_config())
    shrink(config)
    add_read_delimiters(config, _model_class(model_type))
    shrink_channel_lists(config_tree(config), HEADS * text_head_dim(config))
    shrink_conv_towers(config_tree(config))
    fixed = small_images and _images.fixed_size(
        image_processor_for(model_type, processor_class_for(model_type))
    )
    factor = _images.smaller_images(config) if fixed else 1
    _images.smaller_autoencoder(config)
    _images.fewer_linear_heads(config, HEADS)
    processor = build_processor(model_type, config)
    _images.follow_pinpoints(processor.image_processor, config)
    tokenizer = processor.tokenizer
    set_token_ids(config, processor)
    image_token_from_expansion(config, processor)
    patch_queries_for_tower(config, processor)
    vocabulary = lay_out_code_ranges(config_tree(config), len(tokenizer))
    for sub in config_tree(config):
        if hasattr(sub, "vocab_size") and isinstance(sub.vocab_size, int):
            sub.vocab_size = vocabulary
        for key, value in list(vars(sub).items()):  # per-layer input vocabularies and the like
            if key.startswith("vocab_size_") and isinstance(value, int) and value > len(tokenizer):
                setattr(sub, key, len(tokenizer))
    config.tie_word_embeddings = False
    config = _rebuilt(config)
    text = getattr(config, "text_config", None) or config
    if (getattr(text, "max_position_embeddings", None) or CONTEXT) < CONTEXT:
        text.max_position_embeddings = CONTEXT  # N = 5 images of a few hundred tokens each
    window_no_layer_uses(text, CONTEXT)
    model_cls = _model_class(model_type)
    attention = None  # transformers' choice: SDPA where each (sub)model has it (the loader's)
    torch.manual_seed(seed)
    try:
        model = model_cls._from_config(config, dtype=dtype, attn_implementation=attention)
    except Exception as exc:  # the shrunk config does not build: name what broke
        raise TinyBuildError(
            f"{model_type}: the shrunk config does not build: {str(exc).strip()}"
        ) from exc
    if with_rope_sections(model, text):  # a checkpoint names them: built again with them
        torch.manual_seed(seed)
        model = model_cls._from_config(config, dtype=dtype, attn_implementation=attention)
    if rope_sections_agreed(model):  # the rope sections cover the rotary width now
        torch.manual_seed(seed)
        model = model_cls._from_config(model.config, dtype=dtype, attn_implementation=attention)
    model = model.eval()
    _agree_on_image_tokens(model, processor)
    if small_images:
        text, images = _images.probe(placeholder_of(processor))
        if factor > 1 and not _images.runs(model, processor, text, images):
            return build(model_type, seed=seed, dtype=dtype, small_images=False)
        _images.smaller_budgets(model, processor, text, images)
    return model, processor


def _agree_on_image_tokens(model: Any, processor: Any) -> None:
    """Where the processor writes a different number of image tokens than the tower gives
    features (``num_additional_image_tokens``: a class token the tower keeps, a processor
    setting a checkpoint saves and a default leaves at 0), the first of 0, 1, 2 with which
    one probe image runs through the model."""
    if not hasattr(processor, "num_additional_image_tokens"):
        return
    text = placeholder_of(processor)
    for extra in (processor.num_additional_image_tokens, 0, 1, 2):
        processor.num_additional_image_tokens = extra
        try:
            inputs = processor(text=[text], images=[probe_image()], return_tensors="pt")
            with torch.no_grad():
                model(**{k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)})
        except Exception:  # this count does not fit the tower: try the next
            continue
        return
    processor.num_additional_image_tokens = 0


def _rebuilt(config: PretrainedConfig) -> PretrainedConfig:
    """The config made again from its fields, as loading a checkpoint makes it, so settings
    derived from the depth (a heterogeneous config's per-layer table) follow the new one."""

    def without_tables(fields: dict) -> dict:
        return {
            k: without_tables(v) if isinstance(v, dict) else v
            for k, v in fields.items()
            if k != "per_layer_config"
        }

    return type(config).from_dict(without_tables(config.to_dict()))


def _model_class(model_type: str) -> type:
    name = MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES[model_type]
    cls = getattr(transformers, name, None)
    if cls is None:
        raise TinyBuildError(f"{model_type}: transformers has no class {name}")
    return cls
