"""The type's own processor, built in code: its processor class and parts
(``lad_lab.testing.generic.classes``), the tiny tokenizer (``lad_lab.testing.generic.tokens``)
and a ChatML chat template writing the processor's image placeholder, between the image
delimiters a checkpoint's template writes, where the processor ships none.

A checkpoint ships these saved agreeing with its config; here the processor's settings are
read from the config's fields of the same name and the image processor resizes to the vision
tower's own size, so the processor's token counts and the tower agree without being told.
Where the two count an image differently (a tile side, a fixed token count, a patch side
under another name), the rules at the end make them agree, from the fields and defaults of
the config and the processor alone (no family is named).
"""

from __future__ import annotations

import inspect
import math
import re
from typing import Any

from transformers import PretrainedConfig

from app.models.conventions import is_delimiter_key
from app.models.saved_processor import stand_in_video_processor, with_stand_in_video
from lad_lab.testing.generic.classes import (
    feature_extractor_for,
    image_processor_for,
    processor_class_for,
    second_tokenizers,
    video_processor_defaults,
)
from lad_lab.testing.generic.shrink import config_tree
from lad_lab.testing.generic.tokens import (
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


_OPENING = ("start", "begin", "open", "boi")


def processor_delimiters(processor: Any, expanded: set[int]) -> tuple[str, str]:
    """The image delimiters the processor holds as token strings (``image_start_token`` ..
    ``image_end_token``) that its expansion of an image leaves out: a checkpoint's template
    writes those around each placeholder (("", "") unless both are there)."""
    vocab = processor.tokenizer.get_vocab()
    found = {"start": "", "end": ""}
    for key, value in vars(processor).items():
        if not (key.endswith("_token") and is_delimiter_key(key) and isinstance(value, str)):
            continue
        if value in vocab and vocab[value] not in expanded and "video" not in key:
            side = "start" if any(word in key for word in _OPENING) else "end"
            found[side] = found[side] or value
    return (found["start"], found["end"]) if all(found.values()) else ("", "")


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
