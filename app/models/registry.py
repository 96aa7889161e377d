"""Registry of family adapters keyed by the config's ``model_type``.

A model type without a written adapter gets the generic one
(``app.models.generic.GenericAdapter``) unless its config says why it cannot be served
(``conventions.refusal``: encoder-decoder, cross-attention images, no image tokens).

The table is built here from the family classes (each declares its ``model_types``), by
plain imports on first lookup (they pull in transformers' processors): a family module
knows nothing of the registry, so no import runs in a circle.
"""

from __future__ import annotations

import functools
from typing import Any

from app.models.base import HFAdapter


class UnsupportedModelError(ValueError):
    """The checkpoint's ``model_type`` cannot be served; the message names why."""


@functools.cache
def _adapters() -> dict[str, type[HFAdapter]]:
    """``model_type`` -> the adapter written for it, built once from the families."""
    from app.models.gemma3 import Gemma3Adapter
    from app.models.glm4v import Glm4vAdapter
    from app.models.hunyuan_vl import HunYuanVLAdapter
    from app.models.idefics3 import Idefics3Adapter, SmolVLMAdapter
    from app.models.internvl import InternVLAdapter
    from app.models.llama4 import Llama4Adapter
    from app.models.llava_onevision import LlavaOnevisionAdapter
    from app.models.llava_onevision1_5 import LlavaOneVision15Adapter
    from app.models.mistral3 import Mistral3Adapter
    from app.models.qwen2_vl import Qwen2VLAdapter
    from app.models.qwen3_5 import Qwen3_5Adapter
    from app.models.qwen3_vl import Qwen3VLAdapter

    families: tuple[type[HFAdapter], ...] = (
        Qwen2VLAdapter,
        LlavaOnevisionAdapter,
        InternVLAdapter,
        Qwen3VLAdapter,
        Qwen3_5Adapter,
        Glm4vAdapter,
        Gemma3Adapter,
        Idefics3Adapter,
        SmolVLMAdapter,
        Mistral3Adapter,
        LlavaOneVision15Adapter,
        HunYuanVLAdapter,
        Llama4Adapter,
    )
    table: dict[str, type[HFAdapter]] = {}
    for adapter_cls in families:
        if not adapter_cls.model_types:
            raise ValueError(f"{adapter_cls.__name__} declares no model_types")
        for model_type in adapter_cls.model_types:
            if model_type in table:
                raise ValueError(f"model_type {model_type!r} has two adapters")
            table[model_type] = adapter_cls
    return table


def supported_model_types() -> tuple[str, ...]:
    return tuple(sorted(_adapters()))


def adapter_class(model_type: str) -> type[HFAdapter]:
    try:
        return _adapters()[model_type]
    except KeyError:
        supported = ", ".join(supported_model_types())
        raise UnsupportedModelError(
            f"unsupported model_type {model_type!r}; supported: {supported}"
        ) from None


def registered(model_type: str) -> bool:
    """Whether ``model_type`` has an adapter written for it (else the generic one)."""
    return model_type in _adapters()


def adapter_for(config: Any) -> type[HFAdapter]:
    """The adapter class for a transformers config: the one registered for its
    ``model_type``, else the generic adapter; raises UnsupportedModelError naming why
    when neither can serve it."""
    from app.models.conventions import refusal
    from app.models.generic import GenericAdapter

    model_type = getattr(config, "model_type", None) or ""
    if registered(model_type):
        return _adapters()[model_type]
    reason = refusal(config)
    if reason is not None:
        written = ", ".join(supported_model_types())
        raise UnsupportedModelError(
            f"model_type {model_type!r} cannot be served: {reason} "
            f"(adapters written for: {written}; any other decoder-only type with image "
            "tokens is served by the generic adapter)"
        )
    return GenericAdapter
