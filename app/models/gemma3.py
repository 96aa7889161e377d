"""Gemma 3 adapter (`Gemma3ForConditionalGeneration`, model_type "gemma3").

What differs from the defaults:

- The chat template writes `<start_of_image>` per image; the processor expands it into
  `\\n\\n<start_of_image>` + 256 `<image_soft_token>` + `<end_of_image>\\n\\n` (a fixed
  ``image_seq_length``, the image resized to the tower's square). R_k is the delimited
  span, delimiters included. Pan-and-scan (extra crops of one image, each delimited like
  an image) is kept off, so that there is exactly one delimited span per image.
- The decoder is hybrid: ``text_config.layer_types`` interleaves sliding-window layers
  (5 of every 6 in released checkpoints, window 1024) with global ones. A sliding
  layer's t_q row cannot reach images more than a window back, so only the global
  (``full_attention``) layers are capturable and Λ is chosen among them.
- The image tokens of one image attend to each other bidirectionally (the model builds
  that mask from ``token_type_ids``, which the processor returns and the prompt forward
  passes on); t_q is a text token, so its row stays causal and the SDPA-row capture
  reads it from the same mask. Label tokens (folded or cached steps) are text
  (token type 0). Attention goes through transformers' attention interface
  (``query_pre_attn_scalar`` scaling; no attention soft-capping in Gemma 3).
- The assistant turn ends with `<end_of_turn>`; positions are plain 1-D.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from PIL import Image
from transformers import Gemma3Processor

from app.engine.encoder_split import EncoderSplit, FirstDim
from app.models.base import HFAdapter, images_per_prompt


class Gemma3Adapter(HFAdapter):
    """Images first as `<start_of_image>` .. `<end_of_image>` spans; Λ among global layers."""

    model_types: ClassVar[tuple[str, ...]] = ("gemma3",)
    image_delimiters: ClassVar[tuple[str, str] | None] = ("<start_of_image>", "<end_of_image>")
    end_token: ClassVar[str | None] = "<end_of_turn>"
    # one pixel_values row per image (pan-and-scan crops make more rows: uncached then)
    encoder_units: ClassVar[EncoderSplit | None] = FirstDim()
    processor_class: ClassVar[type | None] = Gemma3Processor
    processor_settings: ClassVar[tuple[str, ...]] = ("image_seq_length",)
    doc_layout: ClassVar[str] = (
        "`<start_of_image>` + 256 `<image_soft_token>` + `<end_of_image>` per image "
        "(pan-and-scan off); Λ among the global layers of `layer_types`"
    )
    doc_pixel_knob: ClassVar[str] = (
        "none: every image is resized to the tower's square, `image_seq_length` (256) tokens"
    )
    doc_tested: ClassVar[str] = (
        "tiny random Gemma3ForConditionalGeneration (sliding window 32, 3 global of 8 "
        "layers): spans, scores, capture == eager, cached steps, saved checkpoint"
    )

    def __init__(self, model: torch.nn.Module, processor: Any) -> None:
        super().__init__(model, processor)
        if getattr(self.text_config(), "attn_logit_softcapping", None) is not None:
            raise ValueError("attention soft-capping is not supported by the capture")

    def attention_layers(self) -> tuple[int, ...]:
        """The ``full_attention`` layers of ``layer_types`` (every layer when there is no
        sliding window)."""
        text = self.text_config()
        types = getattr(text, "layer_types", None)
        if not types or getattr(text, "sliding_window", None) is None:
            return super().attention_layers()
        kinds = types[: self.num_layers()]
        return tuple(i for i, kind in enumerate(kinds) if kind == "full_attention")

    def processor_images(self, images: Sequence[Sequence[Image.Image]]) -> Any:
        """Nested per prompt (the processor does not split a flat list by prompt)."""
        return images_per_prompt(images)

    def processor_kwargs(self, images: Sequence[Image.Image]) -> dict[str, Any]:
        """Pan-and-scan off: one delimited span per image."""
        return {"do_pan_and_scan": False} if images else {}
