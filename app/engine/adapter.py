"""What the runner needs from a model family: the adapter protocol and the processed batch.

The engine is written against :class:`FamilyAdapter` only; the families implement it in
``app.models`` (one file each) and the loader hands a built adapter to the ``Runner``.
Token spans are half-open ``(start, end)`` indices into the *padded* row and include the
family's image delimiter tokens, so that a_k^(l) sums over everything of image k.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from PIL import Image

from app.engine.encoder_split import EncoderSplit


@dataclass
class PromptBatch:
    """A processed, left-padded batch: model inputs plus what the engine needs later.

    ``inputs`` holds every tensor the processor produced (input_ids, attention_mask, pixel
    values, grids ...). ``n_images`` is N_i per row. ``extra`` is free for the adapter.
    ``images``: the decoded images, flat in the processor's order (set by the runner; the
    encoder cache keys by their content).
    """

    inputs: dict[str, torch.Tensor]
    n_images: list[int]
    extra: dict[str, Any] = field(default_factory=dict)
    images: tuple[Any, ...] = ()

    @property
    def input_ids(self) -> torch.Tensor:
        return self.inputs["input_ids"]

    @property
    def attention_mask(self) -> torch.Tensor:
        return self.inputs["attention_mask"]

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> PromptBatch:
        """Move tensors to ``device``; floating tensors (pixels) also to ``dtype``."""
        moved: dict[str, torch.Tensor] = {}
        for key, value in self.inputs.items():
            if not isinstance(value, torch.Tensor):
                moved[key] = value
            elif dtype is not None and value.is_floating_point():
                moved[key] = value.to(device=device, dtype=dtype)
            else:
                moved[key] = value.to(device)
        return PromptBatch(
            inputs=moved, n_images=list(self.n_images), extra=dict(self.extra), images=self.images
        )


class FamilyAdapter(Protocol):
    """The questions a model family answers: prompt layout, image spans, layers, positions."""

    model: torch.nn.Module
    processor: Any
    tokenizer: Any
    capture: str
    """How the t_q attention rows are captured: "sdpa" (inside transformers' SDPA call) or
    "eager_hook" (per-layer hooks on eager attention; ``app.engine.attention``)."""

    def render(self, n_images: int, text: str) -> str:
        """The prompt string: N images first, then the text, generation prompt added."""
        ...

    def process(
        self, prompts: Sequence[str], images: Sequence[Sequence[Image.Image]]
    ) -> PromptBatch:
        """The processor call on a batch, padded on the LEFT so the last token is t_q."""
        ...

    def image_pixel_budget(self) -> int | None:
        """Most pixels of one image the processor uses (None: unknown); decode shrinks
        larger images to this before the processor sees them."""
        ...

    def image_size_for(self, width: int, height: int) -> tuple[int, int] | None:
        """The exact (width, height) the processor resizes a width x height image to (None:
        not known), so that decode can resize straight to it and the processor's resize
        has nothing left to do."""
        ...

    def image_spans(self, input_ids: torch.Tensor, n_images: int) -> list[tuple[int, int]]:
        """R_k of one (padded) row: ``n_images`` half-open token ranges, delimiters included."""
        ...

    def num_layers(self) -> int:
        """L, the number of decoder layers of the text model."""
        ...

    def attention_layers(self) -> tuple[int, ...]:
        """The decoder layers whose softmax attention sees every image: Λ's candidates."""
        ...

    def context_length(self) -> int | None:
        """Most tokens the model takes in one sequence (None: no known limit)."""
        ...

    def end_token_id(self) -> int:
        """The token written right after a label (end of turn): the label trie's EOS."""
        ...

    def chat_template(self) -> str:
        """The chat template string (part of the prompt hash)."""
        ...

    def prompt_kwargs(self, batch: PromptBatch) -> dict[str, Any]:
        """Model kwargs of the one prompt forward."""
        ...

    def last_positions(self, batch: PromptBatch) -> torch.Tensor:
        """(B,) text position of t_q; valid right after the prompt forward."""
        ...

    def decode_position_ids(self, last: torch.Tensor, depth: int) -> torch.Tensor:
        """Positions of ``depth`` label tokens fed after prompts whose t_q is at ``last``."""
        ...

    def attention_modules(self) -> Sequence[torch.nn.Module | None]:
        """The self-attention module of each decoder layer, in layer order, None for a layer
        without softmax attention (the eager-hook capture hooks them)."""
        ...

    def attn_implementation(self, text: str, vision: str = "sdpa") -> dict[str, str]:
        """Argument of ``model.set_attn_implementation``: ``text`` for the language model."""
        ...

    def text_attn_implementation(self) -> str | None:
        """The language model's current attention implementation."""
        ...

    def vision_attn_implementation(self) -> str | None:
        """The vision tower's attention implementation (part of the encoder cache's key)."""
        ...

    def encoder_split(self) -> EncoderSplit | None:
        """How the pixel inputs split into independently encoded units, for the encoder
        cache (``app.engine.encoder_split``); None: the family's calls bypass it."""
        ...
