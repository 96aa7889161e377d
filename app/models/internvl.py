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

from app.models.base import FamilyAdapter
from app.models.registry import register


class InternVLProcessorNoVideo(InternVLProcessor):
    """InternVL processor without the video processor (which needs torchvision).

    `image_seq_length` is named in the signature so that `save_pretrained` writes it.
    """

    def __init__(
        self,
        image_processor: Any = None,
        tokenizer: Any = None,
        image_seq_length: int = 256,
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            image_processor,
            tokenizer,
            None,
            image_seq_length=image_seq_length,
            chat_template=chat_template,
            **kwargs,
        )


@register
class InternVLAdapter(FamilyAdapter):
    """Images first (`<IMG_CONTEXT>` placeholders), spans `<img>`..`</img>`."""

    model_types: ClassVar[tuple[str, ...]] = ("internvl",)
    image_delimiters: ClassVar[tuple[str, str] | None] = ("<img>", "</img>")
    end_token: ClassVar[str | None] = "<|im_end|>"
    processor_class: ClassVar[type | None] = InternVLProcessorNoVideo
    processor_settings: ClassVar[tuple[str, ...]] = ("image_seq_length",)
