"""Registry of family adapters keyed by the config's ``model_type``.

Public API::

    register(adapter_cls) -> adapter_cls        # class decorator
    adapter_class(model_type) -> type[FamilyAdapter]
    adapter_for(config) -> type[FamilyAdapter]   # by config.model_type
    supported_model_types() -> tuple[str, ...]
    UnsupportedModelError(ValueError)

Built-in families are imported lazily on first lookup, so a family module may
import this one without a cycle.
"""

from __future__ import annotations

import importlib
from typing import Any

from app.models.base import FamilyAdapter

_ADAPTERS: dict[str, type[FamilyAdapter]] = {}
_BUILTIN_MODULES = ("app.models.qwen2_vl", "app.models.llava_onevision", "app.models.internvl")
_loaded = False


class UnsupportedModelError(ValueError):
    """The checkpoint's ``model_type`` has no adapter."""


def register(adapter_cls: type[FamilyAdapter]) -> type[FamilyAdapter]:
    """Class decorator: serve every ``adapter_cls.model_types`` with ``adapter_cls``."""
    if not adapter_cls.model_types:
        raise ValueError(f"{adapter_cls.__name__} declares no model_types")
    for model_type in adapter_cls.model_types:
        _ADAPTERS[model_type] = adapter_cls
    return adapter_cls


def _load_builtins() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for name in _BUILTIN_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a family module not written yet
            if exc.name != name:
                raise


def supported_model_types() -> tuple[str, ...]:
    _load_builtins()
    return tuple(sorted(_ADAPTERS))


def adapter_class(model_type: str) -> type[FamilyAdapter]:
    _load_builtins()
    try:
        return _ADAPTERS[model_type]
    except KeyError:
        supported = ", ".join(supported_model_types())
        raise UnsupportedModelError(
            f"unsupported model_type {model_type!r}; supported: {supported}"
        ) from None


def adapter_for(config: Any) -> type[FamilyAdapter]:
    """The adapter class for a transformers config (by ``config.model_type``)."""
    return adapter_class(getattr(config, "model_type", None) or "")
