"""A tiny random instance of any model type of transformers' image-text-to-text mapping.

Nothing here knows a family. The model is the type's own config class with every width,
depth, expert count and vocabulary shrunk by walking the config's fields (and its
sub-configs) by name; the processor is the type's own processor class built in code: its
PIL image processor with image splitting turned off, a byte-level tokenizer carrying every
special token the processor asks its tokenizer for, and a ChatML chat template writing the
processor's own image placeholder where the processor ships none. Spatial settings (image
size, patch size, merges) keep their defaults, so the processor's token counts and the
vision tower agree without being told.

A type that cannot be served (``app.models.generic.refusal``) or whose processor cannot be
built here raises :class:`TinyBuildError` naming why.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import torch
import transformers
from transformers import PretrainedConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING, model_type_to_module_name
from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES
from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

from app.models.generic import (
    processor_class_named,
    refusal,
    stand_in_video_processor,
    with_stand_in_video,
)
from app.models.registry import supported_model_types
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
from app.testing._tiny_generic_parents import inherited_processor_name
from app.testing._tiny_generic_parts import (
    feature_extractor_for,
    second_tokenizers,
    video_processor_defaults,
)
from app.testing._tiny_generic_rope import rope_sections_agreed
from app.testing._tiny_generic_shrink import HEADS, shrink, text_head_dim
from app.testing._tiny_generic_tokens import (
    TOKEN_ID,
    absent_tokens,
    adapter_tokens,
    asked_on_a_call,
    build_tokenizer,
    config_token_stems,
    image_token_from_expansion,
    placeholder_of,
    probe_ids,
    probe_image,
    set_token_ids,
    token_text,
    unwritten_tokens,
)
from app.testing.tiny_models import chatml_template

CONTEXT = 8192
"""Least context of a tiny text model: five images at the tower's own size fit."""

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
    return {k: v for k, v in settings.items() if not TOKEN_ID.search(k) and v is not None}


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
    named: dict[str, str] = adapter_tokens(model_type)
    if _takes_chat_template(processor_cls):  # else it is set on the built processor below
        parts["chat_template"] = None
    for _ in range(12):  # each failure names a tokenizer attribute the processor reads
        tokenizer = build_tokenizer(processor_cls, named, config_token_stems(config))
        parts.update({a: build_tokenizer(processor_cls, named) for a in tokenizers})
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
            named[missing.group(1)] = token_text(missing.group(1))
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
            absent_tokens(processor, tokenizer, named)
            or asked_on_a_call(processor, named)
            or unwritten_tokens(processor, named)
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


_CONFIG_DELIMITER = re.compile(r"^(image|vision)_(start|end)_token_(id|index)$")


def _delimiters(processor: Any, config: PretrainedConfig) -> tuple[str, str]:
    """The image delimiters the config names (``vision_start_token_id`` ...) that the
    processor's expansion leaves out: a checkpoint's template writes those itself."""
    placeholder = placeholder_of(processor)
    vocab = processor.tokenizer.get_vocab()
    expanded = set(probe_ids(processor, placeholder))
    found = {"start": "", "end": ""}
    for sub in config_tree(config):
        for key in vars(sub):
            match = _CONFIG_DELIMITER.match(key)
            if match is None or match.group(1) == "video":
                continue
            stem = re.sub(r"_(id|index)$", "", key)
            text = getattr(processor, stem, None) or token_text(stem)
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
