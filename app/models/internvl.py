"""InternVL adapter (transformers-native `InternVLForConditionalGeneration`, model_type "internvl").

The processor expands each image placeholder into `<img>` + tiles x `<IMG_CONTEXT>`
+ `</img>`, so R_k is the delimited span (delimiters included, all tiles of the image
inside), which the default delimiter pairing finds. The decoder is Qwen2
(InternVL 2.5/3) with 1-D rotary positions, so the default positions for the prompt
and the trie's decode steps hold; the assistant turn ends with `<|im_end|>`.
"""

from __future__ import annotations

from typing import ClassVar

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
