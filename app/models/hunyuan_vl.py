"""HunYuan-VL: the generic adapter, with rope positions computed one row at a time.

HunYuan-VL's rope index gives every image token an image-ordinal axis (the image's index in
its prompt, as the model was trained). transformers' ``get_rope_index`` (5.24) counts that
ordinal across the whole batch, so the first image of a batch's second row gets ordinal 3
where the same prompt alone gets 0: the answer of a row depends on the rows batched with it
(the model matrix's "N=3+5 batch == alone" check measures a 2e-3 difference). This adapter
asks the model for each row's positions alone (same function, one row and that row's
images) and passes them in, so a batch equals its items. Everything else is generic.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from app.engine.adapter import PromptBatch
from app.models.generic import GenericAdapter


class HunYuanVLAdapter(GenericAdapter):
    model_types: ClassVar[tuple[str, ...]] = ("hunyuan_vl",)
    doc_tested: ClassVar[str] = (
        "the model matrix's checks; rope positions per row (transformers numbers images "
        "across the batch), with a test of the batched answer this corrects"
    )

    def prompt_kwargs(self, batch: PromptBatch) -> dict[str, Any]:
        kwargs = super().prompt_kwargs(batch)
        grid = batch.inputs.get("image_grid_thw")
        if grid is None or grid.shape[0] != sum(batch.n_images):  # no images: text positions
            return kwargs
        inner = self._inner()
        kwargs["position_ids"], inner.rope_deltas = row_rope_index(
            inner, batch.inputs, batch.n_images
        )
        return kwargs


def row_rope_index(
    model: Any, inputs: dict[str, torch.Tensor], n_images: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``model.get_rope_index`` of each row alone, stacked: (axes, B, L) and (B, 1)."""
    positions, deltas = [], []
    first = 0
    for row, count in enumerate(n_images):
        pos, delta = model.get_rope_index(
            inputs["input_ids"][row : row + 1],
            mm_token_type_ids=inputs["mm_token_type_ids"][row : row + 1],
            image_grid_thw=inputs["image_grid_thw"][first : first + count],
            attention_mask=inputs["attention_mask"][row : row + 1],
        )
        positions.append(pos)
        deltas.append(delta)
        first += count
    return torch.cat(positions, dim=1), torch.cat(deltas, dim=0)
