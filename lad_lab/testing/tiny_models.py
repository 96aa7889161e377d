"""Tiny randomly initialised MLLMs of the real transformers classes, processors built in code:
the registry of the tiny builders and the one module callers import.

``build_tiny(model_type)`` builds a family the service has an adapter for with that family's
own builder (``lad_lab.testing.families``: layouts pinned by the family's tests, the Qwen
line on the released Qwen vocabularies) and any other model type of transformers'
image-text-to-text mapping with the generic builder (``lad_lab.testing.generic``). Nothing is
downloaded. These models prove the plumbing (spans, label scores, captured attention,
batching, padding), not accuracy.

The modules, lowest first (none imports one above it): ``tiny_base`` (the one byte-level
tokenizer, the ChatML template, random images, the small tower and decoder, the build's
error) and ``qwen_vocab``; ``families.*`` and ``generic.*``; this registry; above it the
model matrix (``matrix``) and ``lad model tiny`` (``tiny_cli``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch

from lad_lab.testing.families import (
    gemma3,
    glm4v,
    idefics3,
    internvl,
    llava_onevision,
    llava_onevision1_5,
    mistral3,
    qwen,
)
from lad_lab.testing.generic import build as generic
from lad_lab.testing.tiny_base import TinyBuildError, random_images

__all__ = [
    "DEEP_LAYERS",
    "FAMILIES",
    "TinyBuildError",
    "attention_layers",
    "build_tiny",
    "random_images",
    "tiny_runner",
]

DEEP_LAYERS = 12
"""Decoder depth of the tiny builds on which layer selection runs: Λ = 7..11 (the default
last 42 %), five candidate layers for K = 2, where the default 4 layers give Λ = L* = {2, 3}.
``build_tiny(family, num_hidden_layers=DEEP_LAYERS)``."""

BUILDERS: dict[str, Callable[..., tuple[torch.nn.Module, Any]]] = {
    "qwen2_5_vl": partial(qwen.build_qwen2, "qwen2_5_vl"),
    "qwen2_vl": partial(qwen.build_qwen2, "qwen2_vl"),
    "llava_onevision": llava_onevision.build,
    "internvl": internvl.build,
    "qwen3_vl": qwen.build_qwen3_vl,
    "qwen3_5": qwen.build_qwen3_5,
    "glm4v": glm4v.build,
    "gemma3": gemma3.build,
    "idefics3": partial(idefics3.build, "idefics3"),
    "smolvlm": partial(idefics3.build, "smolvlm"),
    "mistral3": mistral3.build,
    # a stand-in (Qwen2.5-VL classes behind the published OV-1.5 layout), eager-hook capture
    "llavaonevision1_5": llava_onevision1_5.build,
}
"""Each family with a builder of its own: ``builder(seed=..., **overrides)`` -> (model,
processor). Every other model type is built by ``lad_lab.testing.generic``."""

FAMILIES: tuple[str, ...] = tuple(t for t in BUILDERS if t != "llavaonevision1_5")
"""The families with a builder and an adapter of their own (the stand-in aside)."""


def build_tiny(family: str, *, seed: int = 0, **overrides: Any) -> tuple[torch.nn.Module, Any]:
    """A tiny random model of ``family`` (a model type) and its in-code processor (about a
    second; the first Qwen build of a process also reads the real vocabulary, a few seconds
    more). The families of :data:`BUILDERS` keep their own builders (real Qwen vocabularies,
    layouts pinned by their tests; each module's docstring names its ``overrides``); any
    other model type of transformers' image-text-to-text mapping is built generically
    (``lad_lab.testing.generic``; ``dtype`` is its one override, ``image_pixels`` is
    ignored: images take the tower's own size), raising :class:`TinyBuildError` that names
    why where it cannot be."""
    builder = BUILDERS.get(family)
    if builder is not None:
        return builder(seed=seed, **overrides)
    overrides.pop("image_pixels", None)  # the generic build keeps the tower's image size
    unknown = set(overrides) - {"dtype"}
    if unknown:
        raise TypeError(f"unknown overrides for the generic tiny {family}: {sorted(unknown)}")
    return generic.build(family, seed=seed, **overrides)


def attention_layers(family: str) -> tuple[int, ...]:
    """Every layer of ``build_tiny(family)`` that the capture may be asked for (all of them,
    but for hybrid decoders such as Gemma 3's only the global ones)."""
    from app.models.registry import adapter_for

    model, processor = build_tiny(family)
    return tuple(adapter_for(model.config)(model, processor).attention_layers())


def tiny_runner(
    family: str = "qwen2_5_vl",
    *,
    seed: int = 0,
    layers: Sequence[int] | None = None,
    prompt_variant: str = "vanilla",
    capture: str | None = None,
    **overrides: Any,
) -> Any:
    """A Runner over ``build_tiny(family)`` (model id ``tiny-<family>``). ``layers`` keeps
    only the layers with softmax attention over the whole prompt (a hybrid family's tiny
    model has fewer), so one layer set serves every family; ``capture`` forces the family's
    adapter onto another capture path (the eager-hook fallback's tests)."""
    from app.engine.runner import Runner
    from app.models.registry import adapter_for

    model, processor = build_tiny(family, seed=seed, **overrides)
    adapter = adapter_for(model.config)(model, processor)
    if capture is not None:
        adapter.capture = capture
    if layers is not None:
        eligible = adapter.attention_layers()
        layers = [layer for layer in layers if layer in eligible]
    return Runner(adapter, model_id=f"tiny-{family}", layers=layers, prompt_variant=prompt_variant)
