"""Qwen2-VL and Qwen2.5-VL: one adapter (same prompt layout, same 3-D "mrope" positions).

Image k is ``<|vision_start|> <|image_pad|>*n_k <|vision_end|>``; its span R_k
includes both delimiters. The prompt forward lets the model compute its 3-D
rope positions from ``mm_token_type_ids`` and the image grids (left padding
honoured through the attention mask); the model leaves the per-row offset
``rope_deltas`` (text position = index among non-pad tokens + delta) on
``model.model``. Cached label steps then continue each row's text positions from
there: position of the d-th label token = (n_real - 1 + delta) + d, the same for
the three rope axes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from PIL import Image
from transformers import Qwen2_5_VLProcessor, Qwen2VLProcessor
from transformers.image_utils import SizeDict
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

from app.engine.adapter import PromptBatch
from app.engine.encoder_split import EncoderSplit, GridRows
from app.models import qwen_inputs
from app.models.base import HFAdapter, size_field, without_video_processor

Qwen2VLProcessorNoVideo = without_video_processor(
    Qwen2VLProcessor, "Qwen2VLProcessorNoVideo", __name__
)
Qwen2_5_VLProcessorNoVideo = without_video_processor(
    Qwen2_5_VLProcessor, "Qwen2_5_VLProcessorNoVideo", __name__
)


class Qwen2VLAdapter(HFAdapter):
    model_types: ClassVar[tuple[str, ...]] = ("qwen2_vl", "qwen2_5_vl")
    image_delimiters: ClassVar[tuple[str, str] | None] = ("<|vision_start|>", "<|vision_end|>")
    end_token: ClassVar[str | None] = "<|im_end|>"
    # the two processors differ only in video handling, which is not used here
    processor_class: ClassVar[type | None] = Qwen2_5_VLProcessorNoVideo
    # the config keys of the image delimiters' token ids
    delimiter_id_keys: ClassVar[tuple[str, str]] = ("vision_start_token_id", "vision_end_token_id")
    # times the processor's pixel range counts an image's area (GLM-4V: its 2 temporal patches)
    pixel_budget_frames: ClassVar[int] = 1
    # each image's patches are pixel_values rows t*h*w of its grid row (the tower attends
    # within each image only)
    encoder_units: ClassVar[EncoderSplit | None] = GridRows()
    doc_layout: ClassVar[str] = (
        "`<|vision_start|>` + `<|image_pad|>` × pixels / 784 + `<|vision_end|>` per image; "
        "3-D mrope positions"
    )
    doc_pixel_knob: ClassVar[str] = (
        "the image processor's pixel range [min, max] (aspect kept, sides multiples of 28); "
        "checkpoint default 3 136 .. 12 845 056 pixels, up to 16 384 tokens per image"
    )
    doc_tested: ClassVar[str] = (
        "tiny random Qwen2-VL and Qwen2.5-VL with the released Qwen vocabulary, 4 and 12 "
        "decoder layers: spans, captured == eager, trie == brute force, batching, save/load, "
        "calibrate + retrieve end to end; no released checkpoint run here"
    )

    def __init__(self, model: torch.nn.Module, processor: Any) -> None:
        super().__init__(model, processor)
        qwen_inputs.install(processor)  # perm_avg's N rotations: each image processed once

    @classmethod
    def set_pixel_budget(
        cls, processor: Any, max_pixels: int | None, min_pixels: int | None
    ) -> str | None:
        """The image processor resizes each image (aspect kept, sides multiples of 28) into
        [min_pixels, max_pixels]; one image token per 28 x 28 pixels. Released checkpoints
        allow up to 12.8 M pixels (16k tokens) per image."""
        image_processor = processor.image_processor
        size, frames = image_processor.size, cls.pixel_budget_frames
        longest = max_pixels * frames if max_pixels else size.longest_edge
        shortest = min_pixels * frames if min_pixels else size.shortest_edge
        if shortest > longest:
            raise ValueError(
                f"LAD_MIN_PIXELS={shortest // frames} is above LAD_MAX_PIXELS={longest // frames}"
            )
        image_processor.size = SizeDict(shortest_edge=shortest, longest_edge=longest)
        side = int(image_processor.patch_size) * int(image_processor.merge_size)  # 28; Qwen3: 32
        shortest, longest = shortest // frames, longest // frames
        return (
            f"{shortest}..{longest} pixels per image, at most {longest // (side * side)} "
            "image tokens each"
        )

    def image_spans(self, input_ids: torch.Tensor, n_images: int) -> list[tuple[int, int]]:
        open_key, close_key = self.delimiter_id_keys
        open_id = getattr(self.config, open_key, None)
        close_id = getattr(self.config, close_key, None)
        if open_id is None or close_id is None:
            return super().image_spans(input_ids, n_images)
        ids = input_ids.tolist()
        starts = [i for i, t in enumerate(ids) if t == open_id]
        ends = [i + 1 for i, t in enumerate(ids) if t == close_id]
        if len(starts) != n_images or len(ends) != n_images:
            opening, closing = self.image_delimiters or ("", "")
            raise ValueError(
                f"expected {n_images} {opening}..{closing} spans, "
                f"found {len(starts)} and {len(ends)}"
            )
        return list(zip(starts, ends, strict=True))

    def image_pixel_budget(self) -> int | None:
        """The processor's max_pixels (transformers 5 keeps it as ``size["longest_edge"]``,
        an area, beside the older ``max_pixels`` attribute)."""
        image_processor = getattr(self.processor, "image_processor", None)
        budget = getattr(image_processor, "max_pixels", None) or size_field(
            getattr(image_processor, "size", None), "longest_edge"
        )
        return int(budget) // self.pixel_budget_frames if budget else None

    def image_size_for(self, width: int, height: int) -> tuple[int, int] | None:
        """The processor's own rule: sides multiples of patch x merge (28), the area within
        [shortest_edge, longest_edge] of ``size``, aspect kept as closely as possible."""
        image_processor = getattr(self.processor, "image_processor", None)
        size = getattr(image_processor, "size", None)
        low, high = size_field(size, "shortest_edge"), size_field(size, "longest_edge")
        patch, merge = (getattr(image_processor, k, None) for k in ("patch_size", "merge_size"))
        if not (low and high and patch and merge):
            return None
        try:
            h, w = smart_resize(height, width, int(patch) * int(merge), int(low), int(high))
        except ValueError:  # aspect ratio beyond the processor's limit: decode refuses it
            return None
        return int(w), int(h)

    def processor_kwargs(self, images: Sequence[Image.Image]) -> dict[str, Any]:
        """Skip what decode already did: the RGB conversion (``processor_images`` hands over
        RGB images), and the resize when every image already has the processor's own size
        (decode resamples straight to it; a resize to the same size only copies pixels)."""
        if not images:
            return {}
        kwargs: dict[str, Any] = {"do_convert_rgb": False}
        if all(self.image_size_for(*image.size) == image.size for image in images):
            kwargs["do_resize"] = False
        return kwargs

    def process(
        self, prompts: Sequence[str], images: Sequence[Sequence[Image.Image]], **options: Any
    ) -> PromptBatch:
        """As the base, and notes which images repeat (perm_avg's rotations, calibration).
        When decode already made every image's size (and no processor option is asked for),
        the processor's tensors are computed directly (``app.models.qwen_inputs``: the same
        values, a fraction of the time)."""
        flat = self.processor_images(images) or []
        sized = all(self.image_size_for(*image.size) == image.size for image in flat)
        if not options and qwen_inputs.applies(self.processor, flat, sized):
            inputs = qwen_inputs.qwen_inputs(self.processor, prompts, flat)
            batch = PromptBatch(inputs=inputs, n_images=[len(row) for row in images])
        else:
            batch = super().process(prompts, images, **options)
        sources = qwen_inputs.image_sources([image for row in images for image in row])
        if sources is not None:
            batch.extra["image_sources"] = sources
        return batch

    def prompt_kwargs(self, batch: PromptBatch) -> dict:
        # mrope positions come from the model's own get_rope_index (mask-aware)
        self._inner().rope_deltas = None
        kwargs = dict(batch.inputs)
        sources = batch.extra.get("image_sources")
        if sources is not None and "pixel_values" in kwargs:  # repeated images: encode once
            kwargs["mm_encoder_outputs"] = {
                "image": qwen_inputs.unique_image_features(
                    self._inner(), kwargs.pop("pixel_values"), kwargs["image_grid_thw"], sources
                )
            }
        return kwargs

    def _inner(self) -> torch.nn.Module:
        return getattr(self.model, "model", self.model)

    def last_positions(self, batch: PromptBatch) -> torch.Tensor:
        real = batch.attention_mask.long().sum(-1) - 1
        deltas = getattr(self._inner(), "rope_deltas", None)
        if deltas is None:  # text-only prompt: plain 1-D positions
            return real
        return real + deltas.reshape(-1).to(real.device)

    def decode_position_ids(self, last: torch.Tensor, depth: int) -> torch.Tensor:
        steps = torch.arange(1, depth + 1, device=last.device)
        text = last[:, None] + steps[None, :]  # (R, d)
        return text[None].expand(3, -1, -1)  # temporal, height, width axes alike
