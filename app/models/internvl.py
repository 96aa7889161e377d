"""InternVL adapter (transformers-native `InternVLForConditionalGeneration`, model_type "internvl").

The processor expands each image placeholder into `<img>` + tiles x `<IMG_CONTEXT>`
+ `</img>`, so R_k is the delimited span (delimiters included, all tiles of the image
inside), which the default delimiter pairing finds. The decoder is Qwen2
(InternVL 2.5/3) with 1-D rotary positions, so the default positions for the prompt
and the trie's decode steps hold; the assistant turn ends with `<|im_end|>`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from transformers import InternVLProcessor

from app.models.base import HFAdapter, without_video_processor
from app.models.registry import register

InternVLProcessorNoVideo = without_video_processor(
    InternVLProcessor, "InternVLProcessorNoVideo", __name__
)


@register
class InternVLAdapter(HFAdapter):
    """Images first (`<IMG_CONTEXT>` placeholders), spans `<img>`..`</img>`."""

    model_types: ClassVar[tuple[str, ...]] = ("internvl",)
    image_delimiters: ClassVar[tuple[str, str] | None] = ("<img>", "</img>")
    end_token: ClassVar[str | None] = "<|im_end|>"
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
