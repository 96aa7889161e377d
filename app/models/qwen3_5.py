"""Qwen3.5 (dense and MoE): the Qwen3-VL prompt layout on a hybrid language model.

The prompt, the processor (``Qwen3VLProcessor``), the image spans and the mrope positions
are Qwen3-VL's (``app.models.qwen3_vl``; no deepstack). The text model interleaves
``linear_attention`` layers (Gated DeltaNet: a recurrent state, no attention matrix) with
``full_attention`` layers (softmax attention through transformers' attention interface),
as ``text_config.layer_types`` lists them (by default every fourth layer is full). Only
the full-attention layers have an attention row to read, and each sees every image, so
they alone are Λ's candidates (:meth:`attention_layers`).

The linear-attention layers ignore left padding exactly (the model zeroes the hidden
states of padding before their convolution, so the recurrent state stays zero there),
and their conv and recurrent states travel in the prompt's cache to the cached label
steps (``app.engine.runner`` copies every kind of cache layer row by row).
"""

from __future__ import annotations

from typing import ClassVar

from app.models.qwen3_vl import Qwen3VLAdapter

FULL_ATTENTION = "full_attention"


class Qwen3_5Adapter(Qwen3VLAdapter):
    model_types: ClassVar[tuple[str, ...]] = ("qwen3_5", "qwen3_5_moe")
    doc_layout: ClassVar[str] = (
        "`<|vision_start|>` `<|image_pad|>`×n_k `<|vision_end|>` per image, in order; "
        "Λ holds only the full-attention layers of `layer_types`"
    )
    doc_tested: ClassVar[str] = (
        "tiny random hybrid instances: spans, label scores, captured == eager, batching, "
        "cached steps over linear-attention state, Λ from layer_types, saved checkpoint "
        "served; MoE (qwen3_5_moe): served, captured == eager"
    )

    def attention_layers(self) -> tuple[int, ...]:
        """The ``full_attention`` layers of ``text_config.layer_types`` (all layers when the
        config lists none)."""
        kinds = getattr(self.text_config(), "layer_types", None)
        if not kinds:
            return super().attention_layers()
        return tuple(i for i, kind in enumerate(kinds) if kind == FULL_ATTENTION)
