"""The parts of a processor besides its image processor and tokenizer, built in code.

An omni model's processor takes an audio feature extractor (no audio is ever sent): the one
transformers maps to the type, to a type it derives from, to its processor's own model
module, or to the model type of an audio sub-config (the config class's default for it where a
default config leaves it out); where none is mapped and the processor
can go without one (its ``__init__`` defaults it to None), none. A processor with a second
tokenizer (InstructBLIP's ``qformer_tokenizer``) gets one built as its main one is.
"""

from __future__ import annotations

import inspect
from typing import Any

import transformers
from transformers import PretrainedConfig
from transformers.models.auto.configuration_auto import model_type_to_module_name
from transformers.models.auto.feature_extraction_auto import FEATURE_EXTRACTOR_MAPPING_NAMES

from app.testing._tiny_generic_parents import parent_types


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
