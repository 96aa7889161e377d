"""The type's own processor, built in code: its processor class, its PIL image processor with
image splitting turned off, the tiny tokenizer (``lad_lab.testing._tiny_generic_tokens``) and a
ChatML chat template writing the processor's image placeholder where the processor ships
none.

A checkpoint ships these saved agreeing with its config; here the processor's settings are
read from the config's fields of the same name and the image processor resizes to the vision
tower's own size, so the processor's token counts and the tower agree without being told.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import transformers
from transformers import PretrainedConfig
from transformers.models.auto.configuration_auto import model_type_to_module_name
from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES
from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

from app.models.registry import supported_model_types
from app.models.saved_processor import (
    processor_class_named,
    stand_in_video_processor,
    with_stand_in_video,
)
from app.models.torchvision_stand_in import torchvision_only_class
from lad_lab.testing._tiny_generic_agreement import tower_size_from_processor, vit_patch_key
from lad_lab.testing._tiny_generic_defaults import processor_delimiters
from lad_lab.testing._tiny_generic_fields import config_tree
from lad_lab.testing._tiny_generic_parents import inherited_processor_name
from lad_lab.testing._tiny_generic_parts import (
    feature_extractor_for,
    second_tokenizers,
    video_processor_defaults,
)
from lad_lab.testing._tiny_generic_tokens import (
    TOKEN_ID,
    absent_tokens,
    adapter_tokens,
    asked_on_a_call,
    build_tokenizer,
    config_token_stems,
    placeholder_of,
    probe_ids,
    token_text,
    unwritten_tokens,
)
from lad_lab.testing.tiny_base import TinyBuildError, chatml_template

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


def processor_class_for(model_type: str) -> type:
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


def image_processor_for(model_type: str, processor_cls: type) -> Any:
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
    processor_cls = processor_class_for(model_type)
    attributes = processor_cls.get_attributes()
    image_processor = image_processor_for(model_type, processor_cls)
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
