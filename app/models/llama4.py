"""Llama 4: the generic adapter, with a work-around for transformers 5.24's forward.

``Llama4ForConditionalGeneration.forward`` (5.24; 5.23 does not do this) builds its output
from ``outputs.image_outputs``, where ``outputs`` is its language model's
``MoeCausalLMOutputWithPast``, which has no such field: every forward that returns a dict
(ours, and ``generate``'s) raises ``AttributeError``. The language model's output is given
an empty ``image_outputs`` where it lacks one, so the forward completes; nothing it
computes changes (the field is only copied into the returned output). Where a release
fixes the forward, the output has the field and this does nothing. Everything else
(spans, Λ from ``layer_types`` with the chunked layers left out, the template) is generic.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import torch

from app.models.generic import GenericAdapter


class Llama4Adapter(GenericAdapter):
    model_types: ClassVar[tuple[str, ...]] = ("llama4",)
    doc_tested: ClassVar[str] = (
        "the model matrix's checks, through a work-around of transformers 5.24's forward "
        "(it reads a field its language model's output lacks), with a test of the error "
        "it corrects"
    )

    def __init__(self, model: torch.nn.Module, processor: Any) -> None:
        super().__init__(model, processor)
        language_model = getattr(model, "language_model", None)
        if language_model is not None and not hasattr(language_model.forward, "adds_image_outputs"):
            language_model.forward = with_image_outputs(language_model.forward)


def with_image_outputs(forward: Any) -> Any:
    """``forward`` whose output carries ``image_outputs`` (None where it had none)."""

    @functools.wraps(forward)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        out = forward(*args, **kwargs)
        if not isinstance(out, tuple) and not hasattr(out, "image_outputs"):
            object.__setattr__(out, "image_outputs", None)
        return out

    wrapped.adds_image_outputs = True  # type: ignore[attr-defined]  # wrapped once per model
    return wrapped
