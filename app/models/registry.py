"""Registry of family adapters keyed by the config's ``model_type``.

A model type without a registered adapter gets the generic one
(``app.models.generic.GenericAdapter``) unless its config says why it cannot be served
(``conventions.refusal``: encoder-decoder, cross-attention images, no image tokens).

Built-in families are imported on first lookup, so a family module may import this one
(to register itself) without a cycle.
"""

from __future__ import annotations

import importlib
from typing import Any

from app.models.base import HFAdapter

_ADAPTERS: dict[str, type[HFAdapter]] = {}
_BUILTIN_MODULES = (
    "app.models.qwen2_vl",
    "app.models.llava_onevision",
    "app.models.internvl",
    "app.models.qwen3_vl",
    "app.models.qwen3_5",
    "app.models.glm4v",
    "app.models.gemma3",
    "app.models.idefics3",
    "app.models.mistral3",
    "app.models.llava_onevision1_5",
    "app.models.hunyuan_vl",
    "app.models.llama4",
)
_loaded = False


class UnsupportedModelError(ValueError):
    """The checkpoint's ``model_type`` cannot be served; the message names why."""


def register(adapter_cls: type[HFAdapter]) -> type[HFAdapter]:
    """Class decorator: serve every ``adapter_cls.model_types`` with ``adapter_cls``."""
    if not adapter_cls.model_types:
        raise ValueError(f"{adapter_cls.__name__} declares no model_types")
    for model_type in adapter_cls.model_types:
        _ADAPTERS[model_type] = adapter_cls
    return adapter_cls


def _load_builtins() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for name in _BUILTIN_MODULES:
            importlib.import_module(name)


def supported_model_types() -> tuple[str, ...]:
    _load_builtins()
    return tuple(sorted(_ADAPTERS))


def adapter_class(model_type: str) -> type[HFAdapter]:
    _load_builtins()
    try:
        return _ADAPTERS[model_type]
    except KeyError:
        supported = ", ".join(supported_model_types())
        raise UnsupportedModelError(
            f"unsupported model_type {model_type!r}; supported: {supported}"
        ) from None


def registered(model_type: str) -> bool:
    """Whether ``model_type`` has an adapter written for it (else the generic one)."""
    _load_builtins()
    return model_type in _ADAPTERS


def adapter_for(config: Any) -> type[HFAdapter]:
    """The adapter class for a transformers config: the one registered for its
    ``model_type``, else the generic adapter; raises UnsupportedModelError naming why
    when neither can serve it."""
    from app.models.conventions import refusal
    from app.models.generic import GenericAdapter

    model_type = getattr(config, "model_type", None) or ""
    if registered(model_type):
        return _ADAPTERS[model_type]
    reason = refusal(config)
    if reason is not None:
        written = ", ".join(supported_model_types())
        raise UnsupportedModelError(
            f"model_type {model_type!r} cannot be served: {reason} "
            f"(adapters written for: {written}; any other decoder-only type with image "
            "tokens is served by the generic adapter)"
        )
    return GenericAdapter
