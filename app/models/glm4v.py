"""GLM-4V (GLM-4.1V, and GLM-4.5V as ``glm4v_moe``): the Qwen2-VL machinery, GLM's tokens.

Image k is ``<|begin_of_image|> <|image|>*n_k <|end_of_image|>``; its span R_k includes
both delimiters (their ids are the config's ``image_start_token_id`` /
``image_end_token_id``). The vision tower, the processor's resize and the 3-D rope are
Qwen2-VL's in structure: 14-pixel patches merged 2 x 2 (one token per 28 x 28 pixels),
``mm_token_type_ids`` from the processor, positions from the model's own
``get_rope_index`` (the text after an image advances by max(h, w) of its grid, GLM's own
rotary layout inside the attention), ``rope_deltas`` left on ``model.model``; so the
Qwen2-VL adapter's prompt kwargs and cached-step positions hold unchanged.

Differences handled here: the processor's pixel range counts each image twice (an image is
repeated over the 2 temporal patches before the area is checked), and its resize rule is
GLM's own ``smart_resize``; a chat turn has no closing token, the model ends its answer
by opening the next user turn (``<|user|>``, one of its eos ids); GLM-4.5V's template
skips the thinking block with ``enable_thinking=False``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from transformers import Glm4vProcessor
from transformers.models.glm4v.image_processing_pil_glm4v import smart_resize

from app.models.base import size_field, without_video_processor
from app.models.qwen2_vl import Qwen2VLAdapter

Glm4vProcessorNoVideo = without_video_processor(Glm4vProcessor, "Glm4vProcessorNoVideo", __name__)


class Glm4vAdapter(Qwen2VLAdapter):
    model_types: ClassVar[tuple[str, ...]] = ("glm4v", "glm4v_moe")
    image_delimiters: ClassVar[tuple[str, str] | None] = ("<|begin_of_image|>", "<|end_of_image|>")
    delimiter_id_keys: ClassVar[tuple[str, str]] = ("image_start_token_id", "image_end_token_id")
    end_token: ClassVar[str | None] = "<|user|>"
    processor_class: ClassVar[type | None] = Glm4vProcessorNoVideo
    chat_template_kwargs: ClassVar[dict[str, Any]] = {"enable_thinking": False}
    pixel_budget_frames: ClassVar[int] = 2
    doc_layout: ClassVar[str] = (
        "`<|begin_of_image|>` `<|image|>`×n_k `<|end_of_image|>` per image, in order"
    )
    doc_pixel_knob: ClassVar[str] = (
        "`LAD_MAX_PIXELS` / `LAD_MIN_PIXELS` (the processor's area range, which it counts "
        "twice per image): one token per 28 x 28 pixels"
    )
    doc_tested: ClassVar[str] = (
        "tiny random instances: spans, label scores, captured == eager, batching, saved "
        "checkpoint served; GLM-4.5V (glm4v_moe): served, captured == eager"
    )

    def image_size_for(self, width: int, height: int) -> tuple[int, int] | None:
        """GLM's own resize rule (``smart_resize`` over the 2 temporal patches)."""
        image_processor = getattr(self.processor, "image_processor", None)
        size = getattr(image_processor, "size", None)
        low, high = size_field(size, "shortest_edge"), size_field(size, "longest_edge")
        keys = ("patch_size", "merge_size", "temporal_patch_size")
        patch, merge, frames = (getattr(image_processor, k, None) for k in keys)
        if not (low and high and patch and merge and frames):
            return None
        try:
            h, w = smart_resize(
                int(frames), height, width, int(frames), int(patch) * int(merge), low, high
            )
        except ValueError:  # aspect ratio beyond the processor's limit: decode refuses it
            return None
        return int(w), int(h)
