"""LLaVA-OneVision adapter (`LlavaOnevisionForConditionalGeneration`, Qwen2 decoder).

What differs from the defaults:

- The chat template writes one `<image>` per image with no delimiters, so the
  images of one prompt expand into a single run of `<image>` tokens. R_k is found
  by splitting that run: in a multi-image prompt every image is encoded at the base
  resolution (no anyres tiling), so all images of the row have the same number of
  tokens (base patches + one newline token); a lone image may be tiled and owns the
  whole run.
- The processor needs the images nested per prompt: it decides single- vs
  multi-image handling from the per-sample counts (`batch_num_images`).
- Rebuilding the processor offline needs its own settings (`num_image_tokens`,
  `vision_feature_select_strategy`, ...), read back from `processor_config.json`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from PIL import Image
from transformers import LlavaOnevisionProcessor

from app.models.base import HFAdapter, without_video_processor

LlavaOnevisionProcessorNoVideo = without_video_processor(
    LlavaOnevisionProcessor, "LlavaOnevisionProcessorNoVideo", __name__
)


def token_runs(ids: Sequence[int], token_id: int) -> list[tuple[int, int]]:
    """Maximal half-open runs of `token_id` in `ids`, left to right."""
    runs: list[tuple[int, int]] = []
    start: int | None = None
    for i, tid in enumerate(ids):
        if tid == token_id and start is None:
            start = i
        elif tid != token_id and start is not None:
            runs.append((start, i))
            start = None
    if start is not None:
        runs.append((start, len(ids)))
    return runs


class LlavaOnevisionAdapter(HFAdapter):
    """Images first as adjacent `<image>` placeholders, spans split per image."""

    model_types: ClassVar[tuple[str, ...]] = ("llava_onevision",)
    image_delimiters: ClassVar[tuple[str, str] | None] = None
    end_token: ClassVar[str | None] = "<|im_end|>"
    processor_class: ClassVar[type | None] = LlavaOnevisionProcessorNoVideo
    doc_layout: ClassVar[str] = (
        "one `<image>` run per image, no delimiters: base patches + 1 newline token each "
        "(no anyres tiling in multi-image prompts); 1-D positions"
    )
    doc_pixel_knob: ClassVar[str] = (
        "none: each image of a multi-image prompt is encoded at the base resolution (the "
        "setting is ignored, with a warning)"
    )
    doc_tested: ClassVar[str] = (
        "tiny random LLaVA-OneVision (SigLIP at 32 × 32, byte-level tokenizer): spans, "
        "captured == eager, trie == brute force, batching, save/load; no released "
        "checkpoint run here"
    )
    processor_settings: ClassVar[tuple[str, ...]] = (
        "num_image_tokens",
        "vision_feature_select_strategy",
        "vision_aspect_ratio",
        "image_token",
        "video_token",
    )

    @classmethod
    def processor_from_parts(
        cls, image_processor: Any, tokenizer: Any, chat_template: str | None, **settings: Any
    ) -> LlavaOnevisionProcessorNoVideo:
        if settings.get("num_image_tokens") is None:
            raise ValueError("a LLaVA-OneVision processor needs num_image_tokens")
        return super().processor_from_parts(image_processor, tokenizer, chat_template, **settings)

    def image_token_id(self) -> int:
        """Id of the `<image>` placeholder the model fills with visual features."""
        tid = getattr(self.config, "image_token_id", None)
        if tid is None:
            tid = self.token_id(self.processor.image_token)
        return int(tid)

    def processor_images(self, images: Sequence[Sequence[Image.Image]]) -> Any:
        """Images nested per prompt (the processor counts them per sample), None if empty."""
        nested = [[_rgb(img) for img in row] for row in images]
        return nested if any(nested) else None

    def image_spans(self, input_ids: torch.Tensor, n_images: int) -> list[tuple[int, int]]:
        """R_k for one row: the `<image>` run(s), split into `n_images` equal parts."""
        runs = token_runs(input_ids.tolist(), self.image_token_id())
        if len(runs) == n_images:
            return runs
        if len(runs) == 1 and n_images > 1:
            start, end = runs[0]
            per_image, remainder = divmod(end - start, n_images)
            if remainder == 0:
                return [
                    (start + k * per_image, start + (k + 1) * per_image) for k in range(n_images)
                ]
        lengths = [end - start for start, end in runs]
        raise ValueError(f"cannot split <image> runs of lengths {lengths} into {n_images} images")


def _rgb(image: Image.Image) -> Image.Image:
    """RGB as it is (``convert`` would copy the pixels), anything else converted."""
    return image if image.mode == "RGB" else image.convert("RGB")
