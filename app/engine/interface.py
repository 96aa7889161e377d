"""The engine as the service sees it: items in, evidence out, without importing torch.

``RetrievalItem`` and ``ForwardResult`` are what crosses the queue; ``RunnerLike`` is the
part of ``app.engine.runner.Runner`` that the service calls, so that the service (and its
tests, which wrap a runner) are typed without loading torch or a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from PIL import Image

from app.engine.labels import Labels, LabelSpec

if TYPE_CHECKING:
    from calibration_store.profile import Fingerprint


@dataclass(frozen=True)
class RetrievalItem:
    """One retrieval instance: a text query and its N candidate images, in order, with the
    labels of those N as the service resolved them (None: the runner resolves the label
    spec it is given, for callers outside the service)."""

    query: str
    images: Sequence[Image.Image]
    labels: Labels | None = None


@dataclass
class ForwardResult:
    """Per-item scores s (N_i,) and attention a (|Λ|, N_i), plus batch stage timings."""

    scores: list[np.ndarray]
    attention: list[np.ndarray]
    timings_ms: dict[str, float]
    prompt_tokens: list[int] | None = None  # per item: its prompt's tokens, images included


class PromptTooLongError(ValueError):
    """A prompt (with its longest label) longer than the model's context, found after the
    processor counted its tokens and before any forward pass."""

    def __init__(self, tokens: int, label_tokens: int, limit: int) -> None:
        super().__init__(
            f"the prompt is {tokens} tokens (images included) plus up to {label_tokens} "
            f"label token(s), over the model's context of {limit} tokens: send fewer or "
            "smaller images (LAD_MAX_PIXELS bounds the tokens per image)"
        )
        self.tokens, self.label_tokens, self.limit = tokens, label_tokens, limit


class RunnerLike(Protocol):
    """What the service needs from a runner (``app.engine.runner.Runner`` implements it)."""

    model_id: str
    revision: str | None
    layers: tuple[int, ...]

    @property
    def dtype(self) -> Any: ...

    @property
    def device(self) -> Any: ...

    @property
    def attention_backend(self) -> str: ...

    def forward(
        self, items: Sequence[RetrievalItem], labels: LabelSpec = "digits"
    ) -> ForwardResult:
        """Scores and attention of every item, one prompt forward for the batch."""
        ...

    def label_trie(self, labels: Sequence[str]) -> Any:
        """The labels' token trie (raises ValueError when the labels cannot be scored)."""
        ...

    def fingerprint(self, labels: LabelSpec | Labels, n: int) -> Fingerprint:
        """The engine configuration a profile for (labels, N) is valid for."""
        ...

    def special_tokens(self) -> tuple[str, ...]:
        """Token strings user text must not contain (the tokenizer's special tokens)."""
        ...

    def image_pixel_budget(self) -> int | None:
        """Most pixels of one image the model's processor uses (None: unknown)."""
        ...
