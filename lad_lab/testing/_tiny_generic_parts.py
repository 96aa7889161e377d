"""The parts of a processor besides its image processor and tokenizer, built in code.

An omni model's processor takes an audio feature extractor (no audio is ever sent): the one
transformers maps to the type, to a type it derives from, to its processor's own model
module, or to the model type of an audio sub-config (the config class's default for it where a
default config leaves it out); where none is mapped and the processor
can go without one (its ``__init__`` defaults it to None), none. A processor with a second
tokenizer (InstructBLIP's ``qformer_tokenizer``) gets one built as its main one is.
"""

from __future__ import annotations

import ast
import inspect
from typing import Any

import transformers
from transformers import PretrainedConfig
from transformers.models.auto.configuration_auto import model_type_to_module_name
from transformers.models.auto.feature_extraction_auto import FEATURE_EXTRACTOR_MAPPING_NAMES

from lad_lab.testing._tiny_generic_parents import MODELS_DIR, parent_types


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
