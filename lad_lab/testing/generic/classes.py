"""The classes a type's processor is made of, found in transformers' own mappings and sources,
and the parts built from them besides the tokenizer.

The processor class is the type's, else a sibling type's of the same module (an omni thinker
uses its omni model's), else that of the nearest type it derives from: transformers'
generated ``configuration_<type>.py`` flattens a derived config class onto
``PreTrainedConfig``, so its MRO no longer shows that FastVLM's config is LLaVA's or that
GLM-OCR's is GLM-4V's; the type's ``modular_<type>.py`` (the source the generated files are
made from, shipped with the package) still says so: ``class FastVlmConfig(LlavaConfig)``.
The image processor is the type's PIL one (torchvision-only ones on the service's stand-in)
with image splitting turned off. An omni model's processor takes an audio feature extractor
(no audio is ever sent): the one transformers maps to the type, to a type it derives from,
to its processor's own model module, or to the model type of an audio sub-config; where none
is mapped and the processor can go without one, none. A processor with a second tokenizer
(InstructBLIP's ``qformer_tokenizer``) gets one built as its main one is.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import transformers
from transformers import PretrainedConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING, model_type_to_module_name
from transformers.models.auto.feature_extraction_auto import FEATURE_EXTRACTOR_MAPPING_NAMES
from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES
from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

from app.models.registry import supported_model_types
from app.models.saved_processor import processor_class_named
from app.models.torchvision_stand_in import torchvision_only_class
from lad_lab.testing.tiny_base import TinyBuildError

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


MODELS_DIR = Path(transformers.__file__).parent / "models"
"""transformers' model modules, each with its sources (modular, processing, video processing)."""


def parent_types(model_type: str) -> Iterator[str]:
    """Model types ``model_type``'s config class derives from, nearest first: its runtime
    MRO, then the bases its modular source names, each followed up the same way."""
    seen = {model_type}
    queue = [model_type]
    while queue:
        current = queue.pop(0)
        for parent in _direct_parents(current):
            if parent not in seen:
                seen.add(parent)
                queue.append(parent)
                yield parent


def _direct_parents(model_type: str) -> list[str]:
    config_cls = CONFIG_MAPPING[model_type]
    found = [
        base.model_type
        for base in config_cls.__mro__[1:]
        if getattr(base, "model_type", "") in CONFIG_MAPPING
    ]
    for name in _modular_bases(model_type, config_cls.__name__):
        base = getattr(transformers, name, None)
        if getattr(base, "model_type", "") in CONFIG_MAPPING:
            found.append(base.model_type)
    return [t for t in dict.fromkeys(found) if t != model_type]


def _modular_bases(model_type: str, class_name: str) -> list[str]:
    """Names of the bases of ``class_name`` in the type's modular source (none if it has none)."""
    module = model_type_to_module_name(model_type)
    source = MODELS_DIR / module / f"modular_{module}.py"
    if not source.is_file():
        return []
    tree = ast.parse(source.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return [base.id for base in node.bases if isinstance(base, ast.Name)]
    return []


def inherited_processor_name(model_type: str) -> str | None:
    """The processor class of the nearest type ``model_type`` derives from that has one."""
    for parent in parent_types(model_type):
        name = PROCESSOR_MAPPING_NAMES.get(parent)
        if name:
            return name
    return None


def feature_extractor_for(model_type: str, processor_cls: type, config: PretrainedConfig) -> Any:
    """The feature extractor to build ``processor_cls`` with; None where it can do without;
    ``LookupError`` where it needs one and transformers maps none."""
    name = next(
        (
            FEATURE_EXTRACTOR_MAPPING_NAMES[t]
            for t in _candidate_types(model_type, processor_cls, config)
            if FEATURE_EXTRACTOR_MAPPING_NAMES.get(t)
        ),
        None,
    )
    if name and hasattr(transformers, name):
        return getattr(transformers, name)()
    param = inspect.signature(processor_cls.__init__).parameters.get("feature_extractor")
    if param is not None and param.default is None:
        return None
    raise LookupError(f"transformers maps no feature extractor to {model_type}")


def _candidate_types(model_type: str, processor_cls: type, config: PretrainedConfig) -> list[str]:
    own_module = processor_cls.__module__.split(".")[-2]
    types = [model_type, model_type.removesuffix("_thinker"), *parent_types(model_type)]
    types += [
        t for t in FEATURE_EXTRACTOR_MAPPING_NAMES if model_type_to_module_name(t) == own_module
    ]
    for key, value in vars(config).items():
        if "audio" in key and isinstance(value, PretrainedConfig):
            types.append(value.model_type)
    for key, spec in (getattr(type(config), "sub_configs_defaults", None) or {}).items():
        if "audio" in key and isinstance(getattr(spec, "model_type", None), str):
            types.append(spec.model_type)  # an optional audio tower a default leaves out
    return list(dict.fromkeys(types))


def second_tokenizers(attributes: list[str]) -> list[str]:
    """The processor's tokenizers besides ``tokenizer`` (``qformer_tokenizer``)."""
    return [a for a in attributes if a != "tokenizer" and a.endswith("_tokenizer")]


def video_processor_defaults(processor_cls: type) -> dict[str, Any]:
    """The plain class-level settings of the processor's own video processor class, read
    from its source (the class needs torchvision, so it cannot be imported here): a
    processor that reads one of them (Ernie 4.5 VL's ``font`` when saved) finds it on the
    stand-in video processor."""
    module = processor_cls.__module__.split(".")[-2]
    source = MODELS_DIR / module / f"video_processing_{module}.py"
    if not source.is_file():
        return {}
    found: dict[str, Any] = {}
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if not (isinstance(node, ast.ClassDef) and node.name.endswith("VideoProcessor")):
            continue
        for item in node.body:
            if (
                isinstance(item, ast.Assign)
                and len(item.targets) == 1
                and isinstance(item.targets[0], ast.Name)
                and isinstance(item.value, ast.Constant)
            ):
                found.setdefault(item.targets[0].id, item.value.value)
    return found
