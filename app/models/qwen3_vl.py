"""Qwen3-VL (dense and MoE): the Qwen2-VL layout, with 32-pixel image tokens and deepstack.

Image k is ``<|vision_start|> <|image_pad|>*n_k <|vision_end|>`` as in Qwen2-VL; its span
R_k includes both delimiters. What differs, and why the Qwen2-VL answers still hold:

* patches are 16 pixels (not 14), merged 2 x 2: one image token per 32 x 32 pixels, the
  processor (Qwen2-VL's, same ``size`` = [min_pixels, max_pixels] area range) resizes to
  multiples of 32;
* "deepstack": features of intermediate vision layers are added to the hidden states of
  the first decoder layers at the image-token positions. This changes no token and no
  span; repeated images are still encoded once (``qwen_inputs`` reorders those features);
* the mrope (interleaved sections; the text after an image advances by max(h, w) of its
  grid) is computed by the model's own ``get_rope_index`` from ``mm_token_type_ids``,
  which leaves ``rope_deltas`` on ``model.model`` as Qwen2-VL does, so cached label steps
  continue each row's text positions the same way (3 equal axes; the text model builds
  its mask from the attention mask when given 3 axes);
* the chat template has no default system turn and, in the thinking variants, opens a
  ``<think>`` block unless ``enable_thinking=False``: the label is answered directly.
"""

from __future__ import annotations

from typing import Any, ClassVar

from transformers import Qwen3VLProcessor

from app.models.base import without_video_processor
from app.models.qwen2_vl import Qwen2VLAdapter

Qwen3VLProcessorNoVideo = without_video_processor(
    Qwen3VLProcessor, "Qwen3VLProcessorNoVideo", __name__
)


class Qwen3VLAdapter(Qwen2VLAdapter):
    model_types: ClassVar[tuple[str, ...]] = ("qwen3_vl", "qwen3_vl_moe")
    processor_class: ClassVar[type | None] = Qwen3VLProcessorNoVideo
    chat_template_kwargs: ClassVar[dict[str, Any]] = {"enable_thinking": False}
    doc_layout: ClassVar[str] = (
        "`<|vision_start|>` `<|image_pad|>`×n_k `<|vision_end|>` per image, in order; "
        "deepstack features join the first decoder layers at the image tokens"
    )
    doc_pixel_knob: ClassVar[str] = (
        "`LAD_MAX_PIXELS` / `LAD_MIN_PIXELS` (the processor's area range): "
        "one token per 32 x 32 pixels"
    )
    doc_tested: ClassVar[str] = (
        "tiny random instances: spans, label scores, captured == eager, batching, saved "
        "checkpoint served; MoE (qwen3_vl_moe): served, captured == eager"
    )
