"""The runner: a batch of (query, images) -> label scores s and attention evidence a, one forward.

Per batch there is exactly ONE prompt forward (attention rows of the layers in
Λ captured inside SDPA at t_q, see ``app.engine.attention``). Label nodes below
the trie's root (DESIGN §2.1) are scored in one of two ways:

* folded (the common case, e.g. digits "1".."12"): when every row's branching
  nodes below the root lie on one chain, the chain's tokens are appended to the
  prompt. Attention is causal, so nothing at positions <= t_q changes, and the
  same single forward (``use_cache=False``, ``logits_to_keep = D + 1``) yields the
  root logits at t_q and the logits after every chain prefix at t_q+1 .. t_q+D.
  Rows are re-padded on the left so they stay right-aligned; t_q of row r is
  column ``width - 1 - d_r``.
* cached steps (fallback, e.g. number words): for every trie depth d >= 1 that
  has a branching node, one batched step that feeds the d label tokens of each
  requested path on top of a row-selected copy of the prompt's KV cache.

``generate()`` is never used. Items in one batch may have different N and
different images; rows are left-padded.
"""

from __future__ import annotations

import copy
import functools
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache

from app.engine.adapter import FamilyAdapter, PromptBatch
from app.engine.attention import (
    CAPTURE_IMPLEMENTATION,
    EAGER_HOOK_CAPTURE,
    SDPA_CAPTURE,
    aggregate_spans,
    capture,
    default_layers,
    enable_capture,
)
from app.engine.encoder_cache import EncoderCache
from app.engine.identity import config_hash, weights_hash
from app.engine.image_identity import preprocessing_fingerprint
from app.engine.interface import ForwardResult, PromptTooLongError, RetrievalItem
from app.engine.kv_cache import cache_argument, cache_entry
from app.engine.label_scoring import (
    LabelTrie,
    StepFn,
    chain_path,
    fold_batch,
    folded_scoring,
    install_label_head,
    label_head,
    score_label_tries,
)
from app.engine.labels import (
    Labels,
    LabelSpec,
    prompt_hash,
    prompt_text,
    resolve_labels,
    scheme_name,
)
from calibration_store.profile import Fingerprint

TRIE_CACHE_SIZE = 256
_KERNELS = {SDPA_CAPTURE: "sdpa", EAGER_HOOK_CAPTURE: "eager"}
"""The kernel that computes the text attention under each capture (fingerprinted)."""


def _select_cache_rows(cache: DynamicCache, rows: torch.Tensor) -> DynamicCache:
    """A new cache holding only batch rows ``rows`` (the prompt cache is left untouched).

    Each layer, whatever it holds (keys and values, or a linear-attention layer's conv and
    recurrent states), is copied with its own state containers and row-selected by
    transformers' ``reorder_cache``, which writes new tensors into the copy only."""
    selected = copy.copy(cache)
    selected.layers = []
    for layer in cache.layers:
        clone = copy.copy(layer)
        for name, value in vars(layer).items():
            if isinstance(value, dict):  # per-state tensors: the copy gets its own dict
                setattr(clone, name, dict(value))
        clone.reorder_cache(rows)
        selected.layers.append(clone)
    return selected


def _choice_tokens(tries: Sequence[LabelTrie]) -> frozenset[int]:
    """The tokens whose logits the scoring of ``tries`` reads (the label head's rows)."""
    return frozenset().union(*(t.choice_tokens for t in tries))


class Runner:
    """Holds one model through its family adapter; ``forward`` is thread-safe.

    The caller (``app.models.loader``) builds the adapter; the runner never looks a family up.
    """

    def __init__(
        self,
        adapter: FamilyAdapter,
        *,
        model_id: str = "in-memory",
        revision: str | None = None,
        layers: Sequence[int] | None = None,
        prompt_variant: str = "vanilla",
        threads: int | None = None,
        encoder_cache_mb: float = 0,
    ) -> None:
        if threads is not None:
            torch.set_num_threads(int(threads))
        self.adapter = adapter
        self.model = adapter.model.eval()
        self.processor = adapter.processor
        self.model_id = model_id
        """The name the model is served under (LAD_SERVED_MODEL_NAME; the profiles' key)."""
        self.revision = revision
        self.config_hash = config_hash(self.model.config)
        self.weights_hash = weights_hash(self.model)  # before the capture patches the model
        self.prompt_variant = prompt_variant
        prompt_hash(prompt_variant, "")  # validates the variant early
        self.num_layers = self.adapter.num_layers()
        eligible = self.adapter.attention_layers()  # the capture is asked for no other layer
        chosen = (
            default_layers(self.num_layers, attention_layers=eligible)
            if layers is None
            else tuple(layers)
        )
        if not chosen or any(int(layer) not in eligible for layer in chosen):
            every = eligible == tuple(range(self.num_layers))
            shown = f"0..{self.num_layers - 1}" if every else ", ".join(map(str, eligible))
            raise ValueError(
                f"layers must be a non-empty subset of {shown} (the layers with softmax "
                "attention over the whole prompt)"
            )
        self.layers: tuple[int, ...] = tuple(sorted({int(layer) for layer in chosen}))
        enable_capture(self.model, self.adapter)
        install_label_head(self.model)
        self._lock = threading.Lock()
        self._tries: dict[tuple[str, ...], LabelTrie] = {}
        self._fold_chains = True  # False forces the cached-step path (tests compare both)
        self.encoder_cache = EncoderCache(  # image embeddings by content (LAD_ENCODER_CACHE_MB)
            encoder_cache_mb,
            f"{self.config_hash}|{self.weights_hash}|{self.dtype}|"
            f"{self.adapter.vision_attn_implementation()}",
        )

    # ---- properties -------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """Where inputs go: the first parameter's device (cpu when a device_map offloaded
        it to disk, which leaves it on meta; accelerate's hooks then move the inputs)."""
        device = next(self.model.parameters()).device
        return torch.device("cpu") if device.type == "meta" else device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def attention_backend(self) -> str:
        """The text model's attention implementation (the capture path over SDPA, or eager
        under the eager-hook capture)."""
        return self.adapter.text_attn_implementation() or CAPTURE_IMPLEMENTATION

    @property
    def capture(self) -> str:
        """The capture path of the attention rows: "sdpa" or "eager_hook"."""
        return self.adapter.capture

    # ---- prompts and labels -------------------------------------------------------------
    @staticmethod
    def item_labels(items: Sequence[RetrievalItem], labels: LabelSpec) -> list[Sequence[str]]:
        """Each item's label strings: the ones it carries (resolved once, by the service),
        else ``labels`` resolved for its N (callers that pass a spec only)."""
        return [
            item.labels.strings
            if item.labels is not None
            else resolve_labels(labels, len(item.images))
            for item in items
        ]

    def prompts(
        self,
        items: Sequence[RetrievalItem],
        labels: LabelSpec = "digits",
        strings: Sequence[Sequence[str]] | None = None,
    ) -> list[str]:
        """The rendered chat prompt of each item (N images first, then the §2.6 text)."""
        strings = self.item_labels(items, labels) if strings is None else strings
        return [
            self.adapter.render(
                len(item.images), prompt_text(item.query, item_strings, self.prompt_variant)
            )
            for item, item_strings in zip(items, strings, strict=True)
        ]

    def item_tries(
        self, items: Sequence[RetrievalItem], strings: Sequence[Sequence[str]]
    ) -> list[LabelTrie]:
        """Each item's label trie: the one its resolved labels carry (built once, when the
        service checked them), else ``label_trie`` of its strings."""
        return [
            item.labels.trie
            if item.labels is not None and item.labels.trie is not None
            else self.label_trie(item_strings)
            for item, item_strings in zip(items, strings, strict=True)
        ]

    def label_trie(self, labels: Sequence[str]) -> LabelTrie:
        """The labels' token trie, cached (the last TRIE_CACHE_SIZE label lists: custom
        labels come from clients, so the cache must not grow without bound)."""
        key = tuple(labels)
        trie = self._tries.pop(key, None)
        if trie is None:
            trie = LabelTrie.from_labels(self.adapter.tokenizer, key, self.adapter.end_token_id())
        self._tries[key] = trie  # most recently used last
        while len(self._tries) > TRIE_CACHE_SIZE:
            self._tries.pop(next(iter(self._tries)), None)
        return trie

    def special_tokens(self) -> tuple[str, ...]:
        """The tokenizer's special and added control tokens (e.g. ``<|image_pad|>``): user
        text holding one would be read as that token, not as words."""
        tokenizer = self.adapter.tokenizer
        found = set(getattr(tokenizer, "all_special_tokens", ()) or ())
        for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
            if getattr(token, "special", False):
                found.add(str(token))
        return tuple(sorted(t for t in found if t))

    def image_pixel_budget(self) -> int | None:
        """Most pixels of one image the model's processor uses (None: unknown)."""
        return self.adapter.image_pixel_budget()

    def image_size_for(self, width: int, height: int) -> tuple[int, int] | None:
        """The size the model's processor gives a width x height image (None: unknown)."""
        return self.adapter.image_size_for(width, height)

    def fingerprint(self, labels: LabelSpec | Labels, n: int) -> Fingerprint:
        """The engine configuration a profile for (labels, N) is valid for; resolved labels
        give their scheme name, a spec is validated as forward would."""
        if isinstance(labels, Labels):
            scheme = labels.scheme
        else:
            resolve_labels(labels, n)
            scheme = scheme_name(labels)
        return Fingerprint(
            model_id=self.model_id,
            model_revision=self.revision,
            dtype=str(self.dtype).removeprefix("torch."),
            attention_backend=f"{self.attention_backend}({_KERNELS[self.capture]})",
            capture=self.capture,
            prompt_hash=prompt_hash(self.prompt_variant, self.adapter.chat_template()),
            label_scheme=scheme,
            n=int(n),
            config_hash=self.config_hash,
            weights_hash=self.weights_hash,
        )

    # ---- the forward ----------------------------------------------------------------------
    def process(
        self,
        items: Sequence[RetrievalItem],
        labels: LabelSpec = "digits",
        strings: Sequence[Sequence[str]] | None = None,
    ) -> PromptBatch:
        """Processor output for the batch, on the model's device (pixels in its dtype)."""
        prompts = self.prompts(items, labels, strings)
        batch = self.adapter.process(prompts, [list(i.images) for i in items])
        batch.images = tuple(image for item in items for image in item.images)
        return batch.to(self.device, self.dtype)

    def forward(
        self, items: Sequence[RetrievalItem], labels: LabelSpec = "digits"
    ) -> ForwardResult:
        """Scores s and attention a for every item, with one prompt forward for the batch.
        Timings: ``process`` (the processor), ``forward`` (the model), ``score`` (labels)."""
        if not items:
            return ForwardResult(
                scores=[], attention=[], timings_ms={"process": 0.0, "forward": 0.0, "score": 0.0}
            )
        for item in items:
            if not item.images:
                raise ValueError("every item needs at least one image")
        strings = self.item_labels(items, labels)
        tries = self.item_tries(items, strings)
        with self._lock, torch.inference_mode():
            start = time.perf_counter()
            batch = self.process(items, labels, strings)
            process_ms = (time.perf_counter() - start) * 1e3
            self._check_context(batch, tries)
            result = self._forward_processed(batch, tries)
        result.timings_ms = {"process": process_ms, **result.timings_ms}
        result.prompt_tokens = [int(t) for t in batch.attention_mask.sum(-1).tolist()]
        return result

    def _check_context(self, batch: PromptBatch, tries: Sequence[LabelTrie]) -> None:
        """Refuse, before any forward, a row whose prompt plus its longest label would not
        fit the model's context (PromptTooLongError; the service answers 422)."""
        limit = self.adapter.context_length()
        if limit is None:
            return
        tokens = batch.attention_mask.long().sum(-1).tolist()
        for count, trie in zip(tokens, tries, strict=True):
            if int(count) + trie.max_depth > limit:
                raise PromptTooLongError(int(count), trie.max_depth, int(limit))

    def plain_forward_ms(
        self, items: Sequence[RetrievalItem], labels: LabelSpec = "digits"
    ) -> dict[str, float]:
        """The shadow measurement: the same prompt forward as ``forward`` (same folding,
        same kept logits) with nothing captured, i.e. what a plain SDPA model would run.
        Returns its ``process`` and ``forward`` milliseconds; no scores."""
        strings = self.item_labels(items, labels)
        tries = self.item_tries(items, strings)
        with self._lock, torch.inference_mode():
            start = time.perf_counter()
            batch = self.process(items, labels, strings)
            processed = time.perf_counter()
            chains = [chain_path(t) for t in tries]
            with label_head(_choice_tokens(tries)):
                if self._fold_chains and all(c is not None for c in chains):
                    self._folded_forward(batch, chains, record=False)
                else:
                    self._prompt_forward(batch, tries, record=False)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            done = time.perf_counter()
        return {"process": (processed - start) * 1e3, "forward": (done - processed) * 1e3}

    def _forward_processed(
        self, batch: PromptBatch, tries: Sequence[LabelTrie], start: float | None = None
    ) -> ForwardResult:
        """Forward and score a processed batch, row r with ``tries[r]`` (any mix of schemes).

        Folds when every row's trie branches along one chain (and ``_fold_chains``),
        else runs the prompt forward plus cached steps. Every model call computes the
        logits of the labels' tokens only (``app.engine.label_scoring``). The caller holds the lock.
        """
        start = time.perf_counter() if start is None else start
        chains = [chain_path(t) for t in tries]
        fold = self._fold_chains and all(c is not None for c in chains)
        with torch.inference_mode(), label_head(_choice_tokens(tries)) as head:
            if fold:
                logits, attention, batch_chains = self._folded_forward(batch, chains)
            else:
                logits, attention, cache = self._prompt_forward(batch, tries)
            logits = head.take(logits)
            forward_ms = (time.perf_counter() - start) * 1e3

            start = time.perf_counter()
            if fold:
                root, step = folded_scoring(logits, batch_chains)
            else:
                cached = self._cached_step(batch, cache)
                root = logits[:, -1, :]

                def step(rows: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
                    return head.take(cached(rows, paths))

            scores = score_label_tries(tries, root, step, head.columns)
            score_ms = (time.perf_counter() - start) * 1e3
        return ForwardResult(
            scores=[np.asarray(s, dtype=np.float64) for s in scores],
            attention=attention,
            timings_ms={"forward": forward_ms, "score": score_ms},
        )

    def _capture_forward(
        self, batch: PromptBatch, query_index: torch.Tensor | None, *args: Any, **kwargs: Any
    ) -> tuple[Any, list[np.ndarray]]:
        """``_captured_forward`` with the image features through the encoder cache."""
        split = self.adapter.encoder_split()
        with self.encoder_cache.serving(
            self.model,
            split,
            sum(batch.n_images),
            batch.images,
            functools.partial(preprocessing_fingerprint, self.processor),
        ):
            return self._captured_forward(batch, query_index, *args, **kwargs)

    def _captured_forward(
        self,
        batch: PromptBatch,
        query_index: torch.Tensor | None,
        record: bool = True,
        **kwargs: Any,
    ) -> tuple[Any, list[np.ndarray]]:
        """The one prompt forward with the t_q rows of Λ captured; returns (output, a).
        ``record=False``: the same forward with nothing captured (output, [])."""
        if not record:
            return self.model(**self.adapter.prompt_kwargs(batch), **kwargs), []
        with capture(self.layers, query_index) as session:
            out = self.model(**self.adapter.prompt_kwargs(batch), **kwargs)
        spans = [
            self.adapter.image_spans(batch.input_ids[row], n)
            for row, n in enumerate(batch.n_images)
        ]
        return out, aggregate_spans(session, self.layers, spans)

    def _folded_forward(
        self, batch: PromptBatch, chains: Sequence[tuple[int, ...] | None], record: bool = True
    ) -> tuple[torch.Tensor, list[np.ndarray], list[tuple[int, ...]]]:
        """Prompt + each row's chain in one forward; kept logits (B, D + 1, V), a, chains."""
        rows = [c or () for c in chains]
        depth = max(len(c) for c in rows)
        query_index = None
        if depth:
            pad_id = self.adapter.tokenizer.pad_token_id
            pad_id = self.adapter.end_token_id() if pad_id is None else int(pad_id)
            batch, query_index = fold_batch(batch, rows, pad_id)
        out, attention = self._capture_forward(
            batch, query_index, record, use_cache=False, logits_to_keep=depth + 1
        )
        return out.logits, attention, rows

    def _prompt_forward(
        self, batch: PromptBatch, tries: Sequence[LabelTrie], record: bool = True
    ) -> tuple[torch.Tensor, list[np.ndarray], DynamicCache | None]:
        """The plain prompt forward, keeping the KV cache when some row needs steps."""
        needs_steps = any(t.branching_nodes(d) for t in tries for d in range(1, t.max_depth))
        out, attention = self._capture_forward(
            batch, None, record, use_cache=needs_steps, logits_to_keep=1
        )
        return out.logits, attention, cache_entry(out) if needs_steps else None

    def _cached_step(self, batch: PromptBatch, cache: DynamicCache | None) -> StepFn:
        """``step`` of the fallback path: label tokens on top of the prompt's KV cache."""
        last = self.adapter.last_positions(batch)
        mask = batch.attention_mask
        cache_name = cache_argument(self.model.forward)

        def step(rows: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
            if cache is None:
                raise RuntimeError("a cached step was requested but no KV cache was kept")
            depth = paths.shape[1]
            # rows arrive on the logits' device (the last layer's, under a device_map)
            rows = rows.to(mask.device)
            step_mask = torch.cat([mask.index_select(0, rows), mask.new_ones(len(rows), depth)], 1)
            step_out = self.model(
                input_ids=paths.to(mask.device),
                attention_mask=step_mask,
                position_ids=self.adapter.decode_position_ids(
                    last.index_select(0, rows.to(last.device)), depth
                ),
                use_cache=True,
                logits_to_keep=1,
                **{cache_name: _select_cache_rows(cache, rows)},
            )
            return step_out.logits[:, -1, :]

        return step
