"""InternVL adapter (transformers-native `InternVLForConditionalGeneration`, model_type "internvl").

The processor expands each image placeholder into `<img>` + tiles x `<IMG_CONTEXT>`
+ `</img>`, so R_k is the delimited span (delimiters included, all tiles of the image
inside), which the default delimiter pairing finds. The decoder is Qwen2
(InternVL 2.5/3) with 1-D rotary positions, so the default positions for the prompt
and the trie's decode steps hold; the assistant turn ends with `<|im_end|>`.

Several images share one context: as the authors do for multi-image prompts, each of N
images is cut into at most min(max_patches, 28 // N) tiles (12 released, so min(12, 28 // N)),
which keeps twelve images at 3 tiles each (~9.2k tokens) instead of 13 (~40k, past a 32k
context). Rows of one batch with different N are processed apart and joined, so a row's
tensors never depend on the batch it is in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from PIL import Image
from transformers import InternVLProcessor

from app.engine.adapter import PromptBatch
from app.engine.encoder_split import EncoderSplit, FirstDim
from app.models.base import HFAdapter, without_video_processor

InternVLProcessorNoVideo = without_video_processor(
    InternVLProcessor, "InternVLProcessorNoVideo", __name__
)


class InternVLAdapter(HFAdapter):
    """Images first (`<IMG_CONTEXT>` placeholders), spans `<img>`..`</img>`."""

    model_types: ClassVar[tuple[str, ...]] = ("internvl",)
    image_delimiters: ClassVar[tuple[str, str] | None] = ("<img>", "</img>")
    end_token: ClassVar[str | None] = "<|im_end|>"
    # one pixel_values row per tile, each encoded on its own
    encoder_units: ClassVar[EncoderSplit | None] = FirstDim(per_image=False)
    processor_class: ClassVar[type | None] = InternVLProcessorNoVideo
    processor_settings: ClassVar[tuple[str, ...]] = ("image_seq_length",)
    doc_layout: ClassVar[str] = (
        "`<img>` + `<IMG_CONTEXT>` × 256 per 448 × 448 tile + `</img>` per image (a thumbnail "
        "tile too when cut); 1-D positions"
    )
    doc_pixel_knob: ClassVar[str] = (
        "tiles per image: max_pixels // 200 704 (checkpoint default 12), at most "
        "min(12, 28 // N) for N images (the authors' cap); min_pixels rounded up to tiles"
    )
    doc_tested: ClassVar[str] = (
        "tiny random InternVL (one 32 × 32 tile per image, byte-level tokenizer): spans, "
        "captured == eager, trie == brute force, batching, save/load; the tile cap on a "
        "processor with the released tiling; no released checkpoint run here"
    )

    @classmethod
    def set_pixel_budget(
        cls, processor: Any, max_pixels: int | None, min_pixels: int | None
    ) -> str | None:
        """Each image is cut into tiles of the processor's size (448 x 448 in released
        checkpoints, 256 tokens each) plus a thumbnail when cut; the budget is a number of
        tiles: max_pixels // tile pixels (1 = the whole image as one tile, not cut), and
        min_pixels rounded up to tiles. Released checkpoints allow 12 tiles per image."""
        image_processor = processor.image_processor
        tile = int(image_processor.size.height) * int(image_processor.size.width)
        most = image_processor.max_patches if max_pixels is None else max(1, max_pixels // tile)
        least = image_processor.min_patches if min_pixels is None else -(-min_pixels // tile)
        if least > most:
            raise ValueError(
                f"LAD_MIN_PIXELS asks for {least} tiles of {tile} pixels, above the "
                f"{most} that LAD_MAX_PIXELS allows"
            )
        image_processor.max_patches, image_processor.min_patches = most, max(1, least)
        tiles = most + 1 if most > 1 else 1  # the processor always crops (InternVLProcessor)
        tokens = tiles * int(getattr(processor, "image_seq_length", 0) or 0)
        return f"at most {tiles} tiles of {tile} pixels per image ({tokens} image tokens)"

    # the authors' multi-image budget: at most this many tiles over a prompt's N images
    tiles_per_prompt: ClassVar[int] = 28

    def tile_cap(self, n_images: int) -> int:
        """Most tiles per image in a prompt of N images: the processor's max_patches, at
        most ``tiles_per_prompt // N``, never below its min_patches."""
        image_processor = self.processor.image_processor
        most = int(getattr(image_processor, "max_patches", 1) or 1)
        least = int(getattr(image_processor, "min_patches", 1) or 1)
        return max(least, min(most, self.tiles_per_prompt // max(1, n_images)))

    def process(
        self, prompts: Sequence[str], images: Sequence[Sequence[Image.Image]], **options: Any
    ) -> PromptBatch:
        """As the base, each row's images cut into at most ``tile_cap(N)`` tiles; rows whose
        caps differ are processed one by one and joined (left padding, tiles in row order)."""
        caps = [self.tile_cap(len(row)) for row in images]
        if len(set(caps)) <= 1:
            extra = {"max_patches": caps[0]} if caps else {}
            return super().process(prompts, images, **extra, **options)
        rows = [
            super(InternVLAdapter, self).process([prompt], [row], max_patches=cap, **options)
            for prompt, row, cap in zip(prompts, images, caps, strict=True)
        ]
        return join_rows(rows, int(self.tokenizer.pad_token_id))


def join_rows(rows: Sequence[PromptBatch], pad_id: int) -> PromptBatch:
    """One left-padded batch from single-row batches: token tensors (input_ids, the mask)
    padded on the left to the longest row, image tensors (the tiles) concatenated in order."""
    width = max(row.input_ids.shape[1] for row in rows)
    inputs: dict[str, torch.Tensor] = {}
    for key in rows[0].inputs:
        parts = [row.inputs[key] for row in rows]
        if all(part.shape == row.input_ids.shape for part, row in zip(parts, rows, strict=True)):
            fill = pad_id if key == "input_ids" else 0  # the mask and any other token tensor: 0
            parts = [
                torch.cat([part.new_full((1, width - part.shape[1]), fill), part], dim=1)
                for part in parts
            ]
        inputs[key] = torch.cat(parts, dim=0)
    return PromptBatch(inputs=inputs, n_images=[n for row in rows for n in row.n_images])
