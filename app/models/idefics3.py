"""Idefics3 and SmolVLM: one adapter (same image layout, Llama decoder), two processors.

The chat template writes `<image>` per image; the processor resizes the image so its
longest edge is at most ``size["longest_edge"]``, cuts it into tiles of
``max_image_size["longest_edge"]`` pixels (when ``do_image_splitting``) and expands the
placeholder into, per tile, `<fake_token_around_image>` `<row_i_col_j>` + ``image_seq_len``
`<image>`, a newline after each row of tiles, then the downscaled global image
`<fake_token_around_image>` `<global-img>` + ``image_seq_len`` `<image>`
`<fake_token_around_image>`. An image that fits one tile is the global part alone.
R_k runs from image k's first `<fake_token_around_image>` to the one that closes its
global image (tiles, row markers and newlines included). Text attention goes through
transformers' attention interface with 1-D positions; the assistant turn ends with
`<end_of_utterance>`. SmolVLM's processor differs only in its video half (left out: it
needs torchvision) and reads the token names from the tokenizer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from PIL import Image
from transformers import Idefics3Processor, SmolVLMProcessor
from transformers.processing_utils import ProcessorMixin

from app.engine.encoder_split import EncoderSplit, Tiles
from app.models.base import (
    HFAdapter,
    images_per_prompt,
    longest_edge_budget,
    size_field,
    without_video_processor,
)

SmolVLMProcessorNoVideo = without_video_processor(
    SmolVLMProcessor, "SmolVLMProcessorNoVideo", __name__
)

FAKE_IMAGE_TOKEN = "<fake_token_around_image>"
GLOBAL_IMAGE_TOKEN = "<global-img>"


class Idefics3Adapter(HFAdapter):
    """Images first as tiles + a global image between `<fake_token_around_image>` tokens."""

    model_types: ClassVar[tuple[str, ...]] = ("idefics3",)
    end_token: ClassVar[str | None] = "<end_of_utterance>"
    # one unit per real tile of pixel_values (rows, tiles, C, H, W)
    encoder_units: ClassVar[EncoderSplit | None] = Tiles()
    processor_class: ClassVar[type | None] = Idefics3Processor
    processor_settings: ClassVar[tuple[str, ...]] = ("image_seq_len",)
    doc_layout: ClassVar[str] = (
        "per tile `<fake_token_around_image><row_i_col_j>` + `<image>` x image_seq_len, then "
        "the global image `<fake_token_around_image><global-img>` + `<image>` x image_seq_len "
        "+ `<fake_token_around_image>`"
    )
    doc_pixel_knob: ClassVar[str] = (
        "`size.longest_edge` over tiles of `max_image_size.longest_edge` "
        "(`do_image_splitting`); LAD_MAX_PIXELS sets the tiles per side"
    )
    doc_tested: ClassVar[str] = (
        "tiny random Idefics3ForConditionalGeneration with image splitting: spans, "
        "scores, capture == eager, cached steps, saved checkpoint"
    )

    @classmethod
    def set_pixel_budget(
        cls, processor: Any, max_pixels: int | None, min_pixels: int | None
    ) -> str | None:
        """max_pixels becomes a number of tiles per side, isqrt(max_pixels // tile area):
        the longest edge is that many tiles (1: the global image only, no tiles). Released
        checkpoints allow 4 x 4 tiles of 364 (Idefics3) or 512 (SmolVLM) pixels, plus the
        global image. min_pixels has no counterpart (images are never enlarged)."""
        image_processor = processor.image_processor
        tile = int(size_field(image_processor.max_image_size, "longest_edge"))
        if max_pixels is not None:
            per_side = max(1, math.isqrt(int(max_pixels) // (tile * tile)))
            image_processor.size = {"longest_edge": per_side * tile}
        per_side = -(-int(size_field(image_processor.size, "longest_edge")) // tile)
        split = bool(getattr(image_processor, "do_image_splitting", True)) and per_side > 1
        tiles = per_side * per_side + 1 if split else 1
        tokens = tiles * int(getattr(processor, "image_seq_len", 0) or 0)
        ignored = "; LAD_MIN_PIXELS is ignored" if min_pixels is not None else ""
        return f"at most {tiles} tiles of {tile} pixels per image ({tokens} image tokens){ignored}"

    def image_pixel_budget(self) -> int | None:
        """A square of the longest edge."""
        return longest_edge_budget(self.processor)

    def processor_images(self, images: Sequence[Sequence[Image.Image]]) -> Any:
        """Nested per prompt (SmolVLM's processor cannot split a flat list)."""
        return images_per_prompt(images)

    def image_spans(self, input_ids: torch.Tensor, n_images: int) -> list[tuple[int, int]]:
        """R_k from image k's first `<fake_token_around_image>` through the one that follows
        its `<global-img>`."""
        fake, global_id = self.token_id(FAKE_IMAGE_TOKEN), self.token_id(GLOBAL_IMAGE_TOKEN)
        ids = input_ids.tolist()
        spans: list[tuple[int, int]] = []
        start: int | None = None
        after_global = False
        for i, tid in enumerate(ids):
            if tid == fake and start is None:
                start = i
            elif tid == global_id and start is not None:
                after_global = True
            elif tid == fake and after_global:
                spans.append((start, i + 1))
                start, after_global = None, False
        if len(spans) != n_images:
            raise ValueError(
                f"expected {n_images} images closed by {GLOBAL_IMAGE_TOKEN} .. "
                f"{FAKE_IMAGE_TOKEN}, found {len(spans)}"
            )
        return spans


class SmolVLMAdapter(Idefics3Adapter):
    """SmolVLM: Idefics3's layout and decoder, SmolVLM's processor (without video)."""

    model_types: ClassVar[tuple[str, ...]] = ("smolvlm",)
    processor_class: ClassVar[type | None] = SmolVLMProcessorNoVideo
    doc_tested: ClassVar[str] = (
        "tiny random SmolVLMForConditionalGeneration with image splitting: spans, "
        "scores, capture == eager, cached steps, saved checkpoint"
    )

    def render(self, n_images: int, text: str) -> str:
        """Rendered by ``ProcessorMixin``'s template call: SmolVLM's own override only adds
        video-frame defaults, read from the video processor that is left out."""
        return ProcessorMixin.apply_chat_template(
            self.processor,
            self.messages(n_images, text),
            tokenize=False,
            add_generation_prompt=True,
        )
