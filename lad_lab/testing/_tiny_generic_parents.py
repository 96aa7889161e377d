"""The model types a model type is derived from, read from transformers' own sources.

transformers' generated ``configuration_<type>.py`` flattens a derived config class onto
``PreTrainedConfig``, so its MRO no longer shows that FastVLM's config is LLaVA's or that
GLM-OCR's is GLM-4V's; the type's ``modular_<type>.py`` (the source the generated files are
made from, shipped with the package) still says so: ``class FastVlmConfig(LlavaConfig)``.
A type that transformers names no processor class for is served by its parent's processor
(a checkpoint of it names that class in its ``processor_config.json``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import transformers
from transformers.models.auto.configuration_auto import CONFIG_MAPPING, model_type_to_module_name
from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

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
