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
built here raises :class:`TinyBuildError` naming why.
"""

from __future__ import annotations

import inspect
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
import transformers
from transformers import PretrainedConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING, model_type_to_module_name
from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES
from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

from app.models.conventions import refusal
from app.models.registry import adapter_class, registered, supported_model_types
from app.models.saved_processor import (
    processor_class_named,
    stand_in_video_processor,
    with_stand_in_video,
)
from app.models.torchvision_stand_in import torchvision_only_class
from app.testing import _tiny_generic_images as _images
from app.testing._tiny_generic_agreement import (
    patch_queries_for_tower,
    tower_size_from_processor,
    vit_patch_key,
    window_no_layer_uses,
)
from app.testing._tiny_generic_defaults import (
    fill_unset,
    lay_out_code_ranges,
    processor_delimiters,
    shrink_channel_lists,
    shrink_conv_towers,
    with_rope_sections,
)
from app.testing._tiny_generic_fields import add_read_delimiters, config_tree
from app.testing._tiny_generic_layout import (
    derived_head_dim,
    layer_ids_inside,
    merged_widths,
    next_power_of_two,
    shuffled_widths,
)
from app.testing._tiny_generic_parents import inherited_processor_name
from app.testing._tiny_generic_parts import (
    feature_extractor_for,
    second_tokenizers,
    video_processor_defaults,
)
from app.testing._tiny_generic_rope import rope_sections_agreed
from app.testing._tiny_llava_onevision import byte_level_tokenizer
from app.testing.tiny_models import chatml_template

HEADS, KV_HEADS = 2, 1
"""Attention heads of every tower. Head dimensions keep their defaults (rope sections,
partial rotary factors and the like are laid out for them); every hidden width becomes
HEADS x the text model's head dimension, text and vision alike, so projections agree."""
TEXT_LAYERS, VISION_LAYERS = 4, 2
EXPERTS, EXPERTS_PER_TOKEN = 4, 2
_ONE_EACH = ("n_shared_experts", "num_shared_experts", "n_group", "topk_group")
CONTEXT = 8192
"""Least context of a tiny text model: five images at the tower's own size fit."""

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
_TOKEN_ID = re.compile(r"_token_(id|index)$|^(bos|eos|pad)_token_id$")
_MLA = {
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
}
_SPLITTING_OFF = {
    "do_image_splitting": False,
    "crop_to_patches": False,
    "do_pan_and_scan": False,
    "max_patches": 1,
    "max_num_tiles": 1,
    "max_image_tiles": 1,
    "max_crops": 1,
    "max_num_patches": 1,
    "use_thumbnail": False,
}
_PIXEL_RANGE = 64 * 64
"""Pixels of an image for processors that resize into a pixel range (a few tokens)."""


class TinyBuildError(ValueError):
    """This model type has no tiny build; the message names why."""


def image_text_types() -> tuple[str, ...]:
    """Every model type of transformers' image-text-to-text mapping."""
    return tuple(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)


def build(
    model_type: str, *, seed: int = 0, dtype: torch.dtype = torch.float32, small_images: bool = True
) -> tuple[Any, Any]:
    """(model, processor) of ``model_type``, random and tiny; TinyBuildError where it cannot.
    ``small_images``: smaller images where the type's own settings allow
    (``app.testing._tiny_generic_images``; False: the tower's default image size)."""
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
        _image_processor(model_type, _processor_class(model_type))
    )
    factor = _images.smaller_images(config) if fixed else 1
    _images.smaller_autoencoder(config)
    _images.fewer_linear_heads(config, HEADS)
    processor = build_processor(model_type, config)
    _images.follow_pinpoints(processor.image_processor, config)
    tokenizer = processor.tokenizer
    _set_token_ids(config, processor)
    _image_token_from_expansion(config, processor)
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


# ---- the processor -------------------------------------------------------------------------
def _processor_class(model_type: str) -> type:
    """The type's processor class (a sibling type of the same module's, e.g. an omni thinker
    uses its omni model's processor)."""
    name = PROCESSOR_MAPPING_NAMES.get(model_type)
    if name is None:
        module = model_type_to_module_name(model_type)
        for other, candidate in PROCESSOR_MAPPING_NAMES.items():
            if candidate and model_type_to_module_name(other) == module:
                name = candidate
                break
    name = name or inherited_processor_name(model_type)  # the parent type's (FastVLM: LLaVA's)
    if not name:
        raise TinyBuildError(f"{model_type}: transformers names no processor class for it")
    return _importable(name, model_type)


def _importable(name: str, model_type: str) -> type:
    """transformers' class ``name``, or the service's torchvision-free build of it; a
    placeholder class (its module needs torchvision) is refused with that reason."""
    if name == "PixtralProcessor":
        supported_model_types()  # the families' adapters, which hold their own processors
        return processor_class_named(name)
    cls = getattr(transformers, name, None)
    if cls is None:
        raise TinyBuildError(f"{model_type}: transformers has no class {name}")
    if "dummy" in type(cls).__module__ or "DummyObject" in type(cls).__name__:
        raise TinyBuildError(f"{model_type}: {name} needs torchvision, which is not installed")
    return cls


def _image_processor(model_type: str, processor_cls: type) -> Any:
    """The PIL image processor of the type (or of its processor's own model module)."""
    modules = {model_type_to_module_name(model_type), processor_cls.__module__.split(".")[-2]}
    names = IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type) or next(
        (
            v
            for k, v in IMAGE_PROCESSOR_MAPPING_NAMES.items()
            if model_type_to_module_name(k) in modules
        ),
        None,
    )
    names = names if isinstance(names, dict) else {}
    name = names.get("pil")
    if not name and names.get("torchvision"):
        candidate = f"{names['torchvision']}Pil"  # transformers' naming of the PIL twin
        name = candidate if hasattr(transformers, candidate) else None
    if name:
        image_processor = _importable(name, model_type)()
    else:  # torchvision-only: transformers' class on the torch stand-in
        fast = torchvision_only_class(names.get("torchvision") or "")
        if fast is None:
            raise TinyBuildError(f"{model_type}: transformers names no image processor for it")
        image_processor = fast()
    for key, value in _SPLITTING_OFF.items():
        if hasattr(image_processor, key):
            setattr(image_processor, key, value)
    for key in ("min_pixels", "max_pixels"):
        if getattr(image_processor, key, None):
            setattr(image_processor, key, _PIXEL_RANGE)
    size = getattr(image_processor, "size", None)
    area = size is not None and "shortest_edge" in size and "longest_edge" in size
    if area and int(size["longest_edge"]) > 100_000:  # an area range (Qwen-style), not an edge
        image_processor.size = {"shortest_edge": _PIXEL_RANGE, "longest_edge": _PIXEL_RANGE}
    return image_processor


def _sync_image_size(image_processor: Any, config: PretrainedConfig) -> None:
    """The image processor resizes to the vision tower's ``image_size`` (a processor's
    default and a config's default need not agree; a checkpoint saves them agreeing)."""
    vision = getattr(config, "vision_config", None)
    for key, own in (
        (vit_patch_key(image_processor), "patch_size"),
        ("temporal_patch_size", "temporal_patch_size"),
        ("merge_size", "spatial_merge_size"),
    ):
        value = getattr(vision, own, None)
        if isinstance(value, int) and isinstance(getattr(image_processor, key, None), int):
            setattr(image_processor, key, value)  # one patch grid for processor and tower
    side = getattr(vision, "image_size", None)
    if isinstance(side, (list, tuple)):
        side = side[0]
    if not isinstance(side, int):
        return
    size = getattr(image_processor, "size", None)
    if size is not None and "height" in size and "width" in size:
        image_processor.size = {"height": side, "width": side}
    elif size is not None and "shortest_edge" in size and "longest_edge" not in size:
        image_processor.size = {"shortest_edge": side}
    crop = getattr(image_processor, "crop_size", None)
    if crop is not None and "height" in crop:
        image_processor.crop_size = {"height": side, "width": side}


def _token_text(name: str) -> str:
    """The text of the special token for a tokenizer attribute (``image_token``: ``<|image|>``)."""
    return f"<|{name.removesuffix('_token')}|>"


def _settings(processor_cls: type, config: PretrainedConfig) -> dict[str, Any]:
    """The processor's own settings a checkpoint would save with it, read from the config's
    fields of the same name (``patch_size``, ``vision_feature_select_strategy`` ...)."""
    skip = {
        "self",
        "image_processor",
        "tokenizer",
        "video_processor",
        "feature_extractor",
        "chat_template",
        "kwargs",
        "args",
    }
    settings: dict[str, Any] = {}
    for param in inspect.signature(processor_cls.__init__).parameters.values():
        if param.name in skip or param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
            continue
        for sub in config_tree(config):
            value = getattr(sub, param.name, None)
            if value is not None and not isinstance(value, PretrainedConfig):
                settings[param.name] = value
                break
    return {k: v for k, v in settings.items() if not _TOKEN_ID.search(k) and v is not None}


def _image_seq_length(config: PretrainedConfig) -> int | None:
    """Tokens per image of a fixed-length expansion, as the config counts them
    (``num_image_tokens``, ``mm_tokens_per_image``) or as the vision tower's patch grid."""
    for sub in config_tree(config):
        for key in ("num_image_tokens", "mm_tokens_per_image"):
            if isinstance(getattr(sub, key, None), int):
                return int(getattr(sub, key))
    vision = getattr(config, "vision_config", None)
    side, patch = getattr(vision, "image_size", None), getattr(vision, "patch_size", None)
    if isinstance(side, int) and isinstance(patch, int) and patch:
        return (side // patch) ** 2
    return None


def build_processor(model_type: str, config: PretrainedConfig) -> Any:
    """The type's processor built in code (see the module docstring)."""
    processor_cls = _processor_class(model_type)
    attributes = processor_cls.get_attributes()
    image_processor = _image_processor(model_type, processor_cls)
    tower_size_from_processor(processor_cls, config)
    _sync_image_size(image_processor, config)
    if getattr(image_processor, "image_seq_length", 0) is None:  # a checkpoint saves it
        image_processor.image_seq_length = _image_seq_length(config)
    parts: dict[str, Any] = {"image_processor": image_processor}
    if "video_processor" in attributes:  # the real ones need torchvision; no video is sent
        processor_cls = with_stand_in_video(processor_cls)
        parts["video_processor"] = stand_in_video_processor(image_processor)
        for key, value in video_processor_defaults(processor_cls).items():
            if not hasattr(parts["video_processor"], key):
                setattr(parts["video_processor"], key, value)
    if "feature_extractor" in attributes:
        try:
            parts["feature_extractor"] = feature_extractor_for(model_type, processor_cls, config)
        except LookupError as exc:
            raise TinyBuildError(f"{model_type}: its processor needs a feature extractor") from exc
    tokenizers = second_tokenizers(attributes)
    unknown = set(attributes) - {
        "image_processor",
        "tokenizer",
        "video_processor",
        "feature_extractor",
        *tokenizers,
    }
    if unknown:
        raise TinyBuildError(f"{model_type}: its processor also needs {sorted(unknown)}")
    named: dict[str, str] = _adapter_tokens(model_type)
    if _takes_chat_template(processor_cls):  # else it is set on the built processor below
        parts["chat_template"] = None
    for _ in range(12):  # each failure names a tokenizer attribute the processor reads
        tokenizer = _tokenizer(processor_cls, named, _config_token_stems(config))
        parts.update({a: _tokenizer(processor_cls, named) for a in tokenizers})
        try:
            processor = processor_cls(
                tokenizer=tokenizer, **parts, **_settings(processor_cls, config)
            )
        except (AttributeError, ValueError) as exc:
            missing = re.search(r"has no attribute '?(\w+?)(_id)?'?$", str(exc)) or re.search(
                r"missing required attribute '(\w+?)(_id)?'", str(exc)
            )
            if missing is None or missing.group(1) in named:
                raise TinyBuildError(f"{model_type}: its processor does not build: {exc}") from exc
            named[missing.group(1)] = _token_text(missing.group(1))
            continue
        except KeyError as exc:  # a token it looks up in the vocabulary (Fuyu's "|SPEAKER|")
            token = exc.args[0] if exc.args else None
            if not isinstance(token, str) or token in named.values():
                raise TinyBuildError(f"{model_type}: its processor does not build: {exc}") from exc
            named[f"lad_vocab_{len(named)}"] = token
            continue
        except Exception as exc:
            raise TinyBuildError(f"{model_type}: its processor does not build: {exc}") from exc
        absent = (
            _absent_tokens(processor, tokenizer, named)
            or _asked_on_a_call(processor, named)
            or _unwritten_tokens(processor, named)
        )
        if not absent:
            break
        named.update(absent)
    else:
        raise TinyBuildError(f"{model_type}: its processor asks for ever more tokens")
    if not getattr(processor, "chat_template", None):
        processor.chat_template = _chat_template(processor, config)
    return processor


def _takes_chat_template(processor_cls: type) -> bool:
    params = inspect.signature(processor_cls.__init__).parameters.values()
    return any(p.name == "chat_template" or p.kind == p.VAR_KEYWORD for p in params)


def _adapter_tokens(model_type: str) -> dict[str, str]:
    """Tokens the adapter registered for the type reads by name (its end of turn, its image
    delimiters): a checkpoint's vocabulary has them, so the tiny one does too."""
    if not registered(model_type):
        return {}
    adapter = adapter_class(model_type)
    texts = [adapter.end_token, *(adapter.image_delimiters or ())]
    return {f"lad_adapter_{i}": t for i, t in enumerate(texts) if t}


_ASKED = re.compile(r"tokenizer does not have an? `(\w+?)(_id)?` defined")


def _asked_on_a_call(processor: Any, named: dict[str, str]) -> dict[str, str]:
    """A tokenizer attribute the processor asks for only when called (one probe call)."""
    try:
        processor(text=[placeholder_of(processor)], images=[probe_image()])
    except Exception as exc:  # the probe is only to read what the processor asks for
        missing = _ASKED.search(str(exc))
        if missing is not None and missing.group(1) not in named:
            return {missing.group(1): _token_text(missing.group(1))}
    return {}


_TOKEN_LIKE = re.compile(r"<\|?[A-Za-z_][\w.:/-]*\|?>|\[[A-Z][A-Z_]*\]")


def _unwritten_tokens(processor: Any, named: dict[str, str]) -> dict[str, str]:
    """Special tokens the processor's image expansion writes as literal text (``<IMG_START>``,
    ``<low_res_im_start>``) that the tokenizer spells byte by byte: a checkpoint's vocabulary
    has each as one token, so the tiny one gets them too."""
    tokenizer = processor.tokenizer
    ids = _probe_ids(processor, placeholder_of(processor))
    vocab = tokenizer.get_vocab()
    found = dict.fromkeys(_TOKEN_LIKE.findall(tokenizer.decode(ids)))
    taken = set(named.values())
    fresh = [t for t in found if t not in vocab and t not in taken]
    return {f"lad_expansion_{len(named) + i}": t for i, t in enumerate(fresh)}


def _absent_tokens(processor: Any, tokenizer: Any, named: dict[str, str]) -> dict[str, str]:
    """Token strings the processor holds that the tokenizer cannot write as one token."""
    absent: dict[str, str] = {}
    vocab = tokenizer.get_vocab()
    for key, value in vars(processor).items():
        if not key.endswith("_token"):
            continue
        if isinstance(value, str) and value and value not in vocab:
            absent[f"lad_{key}" if key in named else key] = value
        elif value is None and key not in named:  # read from a tokenizer attribute it lacks
            absent[key] = _token_text(key)
    return absent


_CHAT_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def _config_token_stems(config: PretrainedConfig) -> list[str]:
    """``vision_start_token`` for a config field ``vision_start_token_id`` ... (bos, eos and
    pad left out: the tokenizer has its own)."""
    stems = []
    for sub in config_tree(config):
        for key in vars(sub):
            if _TOKEN_ID.search(key) and not key.startswith(("bos_", "eos_", "pad_")):
                stems.append(re.sub(r"_(id|index)$", "", key))
    return list(dict.fromkeys(stems))


def _tokenizer(processor_cls: type, named: dict[str, str], stems: Sequence[str] = ()) -> Any:
    """Byte-level BPE with the chat tokens, the processor's default token strings (its
    ``__init__`` defaults and class attributes) and the ``named`` tokenizer attributes."""
    texts: list[str] = list(_CHAT_TOKENS)
    for param in inspect.signature(processor_cls.__init__).parameters.values():
        if param.name.endswith("_token") and isinstance(param.default, str):
            texts.append(param.default)
    for key, value in vars(processor_cls).items():
        if key.endswith("_token") and isinstance(value, str):
            texts.append(value)
    texts.extend(named.values())
    texts.extend(_token_text(stem) for stem in stems)
    unique = list(dict.fromkeys(t for t in texts if t and t not in _CHAT_TOKENS))
    attributes = {k: v for k, v in named.items() if not k.startswith("lad_")}
    tokenizer = byte_level_tokenizer(unique, attributes)
    if tokenizer.bos_token is None:  # processors that write it into the prompt (PaliGemma)
        tokenizer.bos_token = "<|endoftext|>"
    # saved as the bool it is: a type whose checkpoints transformers loads with another
    # byte-level class (GPT2Tokenizer for HyperCLOVAX) refuses a saved None
    tokenizer.add_prefix_space = bool(tokenizer.add_prefix_space)
    return tokenizer


_CONFIG_DELIMITER = re.compile(r"^(image|vision)_(start|end)_token_(id|index)$")


def _probe_ids(processor: Any, text: str) -> list[int]:
    """Token ids the processor makes of ``text`` with one small image (empty if it fails)."""
    try:
        out = processor(text=[text], images=[probe_image()], return_tensors="pt")
    except Exception:  # a processor that cannot take this probe: nothing learnt
        return []
    return out["input_ids"][0].tolist()


def placeholder_of(processor: Any) -> str:
    """What a prompt writes for an image: the processor's ``image_placeholder_token`` where
    it has one (it expands that into its ``image_token``s), else its image token."""
    for key in ("image_placeholder_token", "image_placeholder", "image_token"):
        value = getattr(processor, key, None)
        if isinstance(value, str) and value:
            return value
    return "<image>"


def probe_image() -> Any:
    from app.testing.tiny_models import random_images

    return random_images(1, seed=99, sizes=[(48, 48)])[0]


def _delimiters(processor: Any, config: PretrainedConfig) -> tuple[str, str]:
    """The image delimiters the config names (``vision_start_token_id`` ...) that the
    processor's expansion leaves out: a checkpoint's template writes those itself."""
    placeholder = placeholder_of(processor)
    vocab = processor.tokenizer.get_vocab()
    expanded = set(_probe_ids(processor, placeholder))
    found = {"start": "", "end": ""}
    for sub in config_tree(config):
        for key in vars(sub):
            match = _CONFIG_DELIMITER.match(key)
            if match is None or match.group(1) == "video":
                continue
            stem = re.sub(r"_(id|index)$", "", key)
            text = getattr(processor, stem, None) or _token_text(stem)
            if text in vocab and vocab[text] not in expanded:
                found[match.group(2)] = found[match.group(2)] or text
    if not found["start"] and not found["end"]:
        return processor_delimiters(processor, expanded)
    if bool(found["start"]) != bool(found["end"]):
        return "", ""
    return found["start"], found["end"]


def _chat_template(processor: Any, config: PretrainedConfig) -> str:
    """ChatML turns; each image part written as the processor's image placeholder, between
    the delimiters the config names where the processor does not write them."""
    opening, closing = _delimiters(processor, config)
    placeholder = opening + placeholder_of(processor) + closing
    return chatml_template(
        "{% for content in message['content'] %}"
        f"{{% if content['type'] == 'image' %}}{placeholder}"
        "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
        "{% endfor %}"
    )


def _image_token_from_expansion(config: PretrainedConfig, processor: Any) -> None:
    """Where the processor's expansion of an image leaves out the token the config names as
    the image token (the placeholder ``<image>`` becomes ``<IMG_ATOM>`` x 256), point the
    config at the token the expansion repeats most: the one the image's features replace."""
    placeholder = placeholder_of(processor)
    ids = _probe_ids(processor, placeholder)
    plain = set(_probe_ids(processor, ""))  # the tokens a prompt has without an image
    counted = Counter(i for i in ids if i not in plain)
    if not counted:
        return
    for owner in (config, getattr(config, "text_config", None)):
        for key in ("image_token_id", "image_token_index"):
            value = getattr(owner, key, None) if owner is not None else None
            if not isinstance(value, int) or isinstance(value, bool):
                continue
            if value not in ids or _only_opens(value, counted):
                setattr(owner, key, counted.most_common(1)[0][0])


def _only_opens(token: int, counted: Counter) -> bool:
    """Whether ``token`` is written once in an image's expansion that repeats another token
    (Llama 4's ``<|image|>`` opening 256 ``<|patch|>``): the repeated one takes the features."""
    return counted.get(token) == 1 and counted.most_common(1)[0][1] > 1


def _set_token_ids(config: PretrainedConfig, processor: Any) -> None:
    """Point the config's token ids at the tokenizer's: ``image_token_id`` at the processor's
    image token, ``<x>_token_id`` at the processor's ``<x>_token`` where it has one, and any
    other id outside the small vocabulary at the padding token."""
    tokenizer = processor.tokenizer
    size = len(tokenizer)
    pad = tokenizer.pad_token_id
    for sub in config_tree(config):
        for key, value in list(vars(sub).items()):
            if not _TOKEN_ID.search(key) or isinstance(value, bool):
                continue
            stem = re.sub(r"_(id|index)$", "", key)
            text = getattr(processor, stem, None)
            if stem == "image_token" and text is None:
                text = getattr(processor, "image_token", None)
            if not isinstance(text, str) or text not in tokenizer.get_vocab():
                text = _token_text(stem)
            if key.startswith(("bos_", "eos_", "pad_")):
                own = getattr(tokenizer, key)
                setattr(sub, key, own if own is not None else pad)
            elif text in tokenizer.get_vocab():
                setattr(sub, key, tokenizer.convert_tokens_to_ids(text))
            elif isinstance(value, int) and value >= size:
                setattr(sub, key, pad)
            elif isinstance(value, list):
                setattr(sub, key, [v if v < size else pad for v in value])
    if getattr(config, "image_token_index", None) is not None and hasattr(config, "image_token_id"):
        config.image_token_index = config.image_token_id
