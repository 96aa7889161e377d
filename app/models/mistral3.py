"""Mistral 3 adapter (`Mistral3ForConditionalGeneration`, model_type "mistral3").

The chat template writes `[IMG]` per image inside the `[INST]` turn; the Pixtral
processor expands it into the image's patch grid row by row, `[IMG]` x width then
`[IMG_BREAK]`, the last row's break replaced by `[IMG_END]`. There is no opening
delimiter, so R_k runs from the first `[IMG]` after image k-1's `[IMG_END]` through its
own `[IMG_END]` (breaks included). Image token counts follow each image's size: the
processor resizes the longest edge to at most ``size["longest_edge"]`` and cuts
patch_size x spatial_merge_size cells (28 x 28 pixels in released checkpoints). The
decoder is Mistral (1-D positions, attention through transformers' interface); the
assistant turn ends with the tokenizer's eos `</s>`.
"""

from __future__ import annotations

import importlib
import math
import sys
import types
from typing import Any, ClassVar

import torch

from app.engine.encoder_split import EncoderSplit, FirstDim
from app.models.base import HFAdapter, longest_edge_budget, size_field


def _pixtral_processor() -> type:
    """transformers' ``PixtralProcessor``. Its module imports one helper (the resized size of
    an image) from the torchvision image processor, so without torchvision, which the
    service does not install, transformers hands out a placeholder that refuses to build.
    The PIL image processor defines the same helper; the module is imported with it
    standing in for the torchvision module, which is removed again right after."""
    processing = "transformers.models.pixtral.processing_pixtral"
    try:
        return importlib.import_module(processing).PixtralProcessor
    except ImportError:
        from transformers.models.pixtral import image_processing_pil_pixtral as pil
    name = "transformers.models.pixtral.image_processing_pixtral"
    stand_in = types.ModuleType(name)
    stand_in.get_resize_output_image_size = pil.get_resize_output_image_size  # type: ignore[attr-defined]
    sys.modules[name] = stand_in
    try:
        return importlib.import_module(processing).PixtralProcessor
    finally:
        sys.modules.pop(name, None)


PixtralProcessor = _pixtral_processor()


def delimited_runs(ids: list[int], member_ids: set[int], end_id: int) -> list[tuple[int, int]]:
    """Half-open spans that open at the first token of ``member_ids`` after the previous
    span and close after the next ``end_id`` (layouts with a closing delimiter only)."""
    spans: list[tuple[int, int]] = []
    start: int | None = None
    for i, tid in enumerate(ids):
        if start is None and tid in member_ids:
            start = i
        if start is not None and tid == end_id:
            spans.append((start, i + 1))
            start = None
    return spans


class Mistral3Adapter(HFAdapter):
    """Images first as `[IMG]` grids closed by `[IMG_END]`, spans split at each `[IMG_END]`."""

    model_types: ClassVar[tuple[str, ...]] = ("mistral3",)
    processor_class: ClassVar[type | None] = PixtralProcessor
    # one (padded) pixel_values row and image_sizes row per image; Pixtral crops each to its
    # size and attends within it
    encoder_units: ClassVar[EncoderSplit | None] = FirstDim()
    processor_settings: ClassVar[tuple[str, ...]] = (
        "patch_size",
        "spatial_merge_size",
        "image_token",
        "image_break_token",
        "image_end_token",
    )
    doc_layout: ClassVar[str] = (
        "`[IMG]` x width + `[IMG_BREAK]` per patch row, the last break replaced by "
        "`[IMG_END]`; R_k from the first `[IMG]` to `[IMG_END]`"
    )
    doc_pixel_knob: ClassVar[str] = (
        "`size.longest_edge` (1540 in released checkpoints), one token per 28 x 28 pixels; "
        "LAD_MAX_PIXELS sets it to sqrt(max_pixels)"
    )
    doc_tested: ClassVar[str] = (
        "tiny random Mistral3ForConditionalGeneration: spans, scores, capture == eager, "
        "cached steps, saved checkpoint"
    )

    @classmethod
    def set_pixel_budget(
        cls, processor: Any, max_pixels: int | None, min_pixels: int | None
    ) -> str | None:
        """The longest edge becomes sqrt(max_pixels), so no image exceeds max_pixels (a
        square reaches it); min_pixels has no counterpart (images are never enlarged)."""
        image_processor = processor.image_processor
        cell = int(processor.patch_size) * int(getattr(processor, "spatial_merge_size", 1) or 1)
        if max_pixels is not None:
            edge = max(cell, math.isqrt(int(max_pixels)))
            image_processor.size = {"longest_edge": edge}
        edge = int(size_field(image_processor.size, "longest_edge"))
        most = (edge // cell) ** 2
        ignored = "; LAD_MIN_PIXELS is ignored" if min_pixels is not None else ""
        return f"longest edge {edge} pixels, at most {most} image tokens per image{ignored}"

    def image_pixel_budget(self) -> int | None:
        """A square of the longest edge."""
        return longest_edge_budget(self.processor)

    def image_spans(self, input_ids: torch.Tensor, n_images: int) -> list[tuple[int, int]]:
        """R_k from the first `[IMG]` after the previous image through `[IMG_END]`."""
        image_id = self.token_id(getattr(self.processor, "image_token", "[IMG]"))
        end_id = self.token_id(getattr(self.processor, "image_end_token", "[IMG_END]"))
        break_id = self.token_id(getattr(self.processor, "image_break_token", "[IMG_BREAK]"))
        spans = delimited_runs(input_ids.tolist(), {image_id, break_id}, end_id)
        if len(spans) != n_images:
            raise ValueError(f"expected {n_images} images closed by [IMG_END], found {len(spans)}")
        return spans
