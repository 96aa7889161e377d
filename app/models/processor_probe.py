"""What a checkpoint's processor does with a prompt, asked once when the adapter is built.

A processor that writes prompts of its own in place of the text it is handed (ShieldGemma
2's writes one policy prompt per image and policy) cannot carry a query over N images: the
query never reaches the model. One call with one small image and a marker query tells.
"""

from __future__ import annotations

from typing import Any

from PIL import Image

MARKER = "lad probe seven four three one"
"""The query of the probe prompt, looked for in the processor's tokens."""


def drops_the_prompt(adapter: Any) -> bool:
    """Whether no row the processor makes of a one-image prompt holds the prompt's query
    (False where the probe itself fails: this only names a processor that answers)."""
    image = Image.new("RGB", (64, 64), (120, 60, 30))
    try:
        prompt = adapter.render(1, MARKER)
        out = adapter.processor(text=[prompt], images=[image], return_tensors="pt")
        rows = [adapter.tokenizer.decode(ids) for ids in out["input_ids"]]
    except Exception:  # a processor this probe cannot drive: nothing learnt
        return False
    squeezed = MARKER.replace(" ", "")
    return not any(squeezed in row.replace(" ", "").replace("▁", "") for row in rows)
