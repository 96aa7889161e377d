"""The runner: a batch of (query, images) -> label scores s and attention evidence a, one forward.

Per batch there is exactly ONE prompt forward (``logits_to_keep=1``; attention
rows of the layers in Λ captured inside SDPA, see ``app.engine.attention``),
followed by the label trie's cached steps (DESIGN §2.1): for every trie depth
d >= 1 that has a branching node, one batched step that feeds the d label
tokens of each requested path on top of a row-selected copy of the prompt's KV
cache. ``generate()`` is never used. Items in one batch may have different N and
different images; rows are left-padded so t_q is the last column.

Public API (stable)::

    RetrievalItem(query: str, images: Sequence[PIL.Image.Image])        # frozen
    ForwardResult(scores: list[np.ndarray (N_i,)],                      # s, log-probs
                  attention: list[np.ndarray (|Λ|, N_i)],               # a_k^(l)
                  timings_ms: {"forward": ms, "score": ms})             # batch totals
    Fingerprint(model_id, model_revision, dtype, attention_backend, prompt_hash,
                label_scheme, n).as_dict()                              # frozen
    Runner(model, processor, *, model_id="in-memory", revision=None, layers=None,
           prompt_variant="vanilla", threads=None)
        .forward(items, labels="digits") -> ForwardResult
        .fingerprint(labels, n) -> Fingerprint
        .prompts(items, labels="digits") -> list[str]     # rendered chat prompts
        .layers (Λ), .num_layers (L), .device, .dtype, .model_id, .revision,
        .prompt_variant, .adapter, .model, .processor, .attention_backend
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers import DynamicCache

from app.engine.attention import (
    CAPTURE_IMPLEMENTATION,
    aggregate_spans,
    capture,
    default_layers,
    enable_capture,
)
from app.engine.labels import LabelTrie, resolve_labels, scheme_name, score_label_tries
from app.models.base import FamilyAdapter, PromptBatch
from app.models.prompts import prompt_hash, prompt_text
from app.models.registry import adapter_for

LabelSpec = str | Sequence[str]


@dataclass(frozen=True)
class RetrievalItem:
    """One retrieval request: a text query and its N candidate images, in order."""

    query: str
    images: Sequence[Image.Image]


@dataclass
class ForwardResult:
    """Per-item scores s (N_i,) and attention a (|Λ|, N_i), plus batch stage timings."""

    scores: list[np.ndarray]
    attention: list[np.ndarray]
    timings_ms: dict[str, float]


@dataclass(frozen=True)
class Fingerprint:
    """What a calibration profile is valid for (DESIGN §2.3)."""

    model_id: str
    model_revision: str | None
    dtype: str
    attention_backend: str
    prompt_hash: str
    label_scheme: str
    n: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _select_cache_rows(cache: DynamicCache, rows: torch.Tensor) -> DynamicCache:
    """A new cache holding only batch rows ``rows`` (the prompt cache is left untouched)."""
    selected = DynamicCache()
    for layer_idx, layer in enumerate(cache.layers):
        selected.update(
            layer.keys.index_select(0, rows), layer.values.index_select(0, rows), layer_idx
        )
    return selected


class Runner:
    """Holds one model with its processor and family adapter; thread-safe ``forward``."""

    def __init__(
        self,
        model: torch.nn.Module,
        processor: Any,
        *,
        model_id: str = "in-memory",
        revision: str | None = None,
        layers: Sequence[int] | None = None,
        prompt_variant: str = "vanilla",
        threads: int | None = None,
    ) -> None:
        if threads is not None:
            torch.set_num_threads(int(threads))
        self.model = model.eval()
        self.processor = processor
        self.adapter: FamilyAdapter = adapter_for(model.config)(model, processor)
        self.model_id = model_id
        self.revision = revision
        self.prompt_variant = prompt_variant
        prompt_hash(prompt_variant, "")  # validates the variant early
        self.num_layers = self.adapter.num_layers()
        chosen = default_layers(self.num_layers) if layers is None else tuple(layers)
        if not chosen or any(not 0 <= int(layer) < self.num_layers for layer in chosen):
            raise ValueError(f"layers must be a non-empty subset of 0..{self.num_layers - 1}")
        self.layers: tuple[int, ...] = tuple(sorted({int(layer) for layer in chosen}))
        enable_capture(self.model, self.adapter)
        self._lock = threading.Lock()
        self._tries: dict[tuple[str, ...], LabelTrie] = {}

    # ---- properties -------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def attention_backend(self) -> str:
        """The text model's attention implementation (the capture path over SDPA)."""
        return self.adapter.text_attn_implementation() or CAPTURE_IMPLEMENTATION

    # ---- prompts and labels -------------------------------------------------------------
    def prompts(self, items: Sequence[RetrievalItem], labels: LabelSpec = "digits") -> list[str]:
        """The rendered chat prompt of each item (N images first, then the §2.6 text)."""
        return [
            self.adapter.render(
                len(item.images),
                prompt_text(
                    item.query, resolve_labels(labels, len(item.images)), self.prompt_variant
                ),
            )
            for item in items
        ]

    def label_trie(self, labels: Sequence[str]) -> LabelTrie:
        key = tuple(labels)
        if key not in self._tries:
            self._tries[key] = LabelTrie.from_labels(
                self.adapter.tokenizer, key, self.adapter.end_token_id()
            )
        return self._tries[key]

    def fingerprint(self, labels: LabelSpec, n: int) -> Fingerprint:
        resolve_labels(labels, n)  # same validation as forward
        return Fingerprint(
            model_id=self.model_id,
            model_revision=self.revision,
            dtype=str(self.dtype).removeprefix("torch."),
            attention_backend=f"{self.attention_backend}(sdpa)",
            prompt_hash=prompt_hash(self.prompt_variant, self.adapter.chat_template()),
            label_scheme=scheme_name(labels),
            n=int(n),
        )

    # ---- the forward ----------------------------------------------------------------------
    def encode(self, items: Sequence[RetrievalItem], labels: LabelSpec = "digits") -> PromptBatch:
        """Processor output for the batch, on the model's device (pixels in its dtype)."""
        batch = self.adapter.encode(self.prompts(items, labels), [list(i.images) for i in items])
        return batch.to(self.device, self.dtype)

    def forward(
        self, items: Sequence[RetrievalItem], labels: LabelSpec = "digits"
    ) -> ForwardResult:
        """Scores s and attention a for every item, with one prompt forward for the batch."""
        if not items:
            return ForwardResult(scores=[], attention=[], timings_ms={"forward": 0.0, "score": 0.0})
        for item in items:
            if not item.images:
                raise ValueError("every item needs at least one image")
        tries = [self.label_trie(resolve_labels(labels, len(item.images))) for item in items]
        needs_steps = any(t.branching_nodes(d) for t in tries for d in range(1, t.max_depth))
        with self._lock, torch.inference_mode():
            start = time.perf_counter()
            batch = self.encode(items, labels)
            with capture(self.layers) as session:
                out = self.model(
                    **self.adapter.prompt_kwargs(batch), use_cache=needs_steps, logits_to_keep=1
                )
            last = self.adapter.last_positions(batch)
            spans = [
                self.adapter.image_spans(batch.input_ids[row], n)
                for row, n in enumerate(batch.n_images)
            ]
            attention = aggregate_spans(session, self.layers, spans)
            forward_ms = (time.perf_counter() - start) * 1e3

            start = time.perf_counter()
            cache = out.past_key_values
            mask = batch.attention_mask

            def step(rows: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
                depth = paths.shape[1]
                step_mask = torch.cat(
                    [mask.index_select(0, rows), mask.new_ones(len(rows), depth)], 1
                )
                step_out = self.model(
                    input_ids=paths,
                    attention_mask=step_mask,
                    position_ids=self.adapter.decode_position_ids(
                        last.index_select(0, rows), depth
                    ),
                    past_key_values=_select_cache_rows(cache, rows),
                    use_cache=True,
                    logits_to_keep=1,
                )
                return step_out.logits[:, -1, :]

            scores = score_label_tries(tries, out.logits[:, -1, :], step)
            score_ms = (time.perf_counter() - start) * 1e3
        return ForwardResult(
            scores=[np.asarray(s, dtype=np.float64) for s in scores],
            attention=attention,
            timings_ms={"forward": forward_ms, "score": score_ms},
        )
