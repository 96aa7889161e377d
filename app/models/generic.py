"""The generic adapter: any decoder-only MLLM of transformers whose image tokens sit in the text.

It answers every adapter question from what the checkpoint and its processor already say,
never from a family table (the convention vLLM's transformers backend serves by):

- **Spans.** The processor expands each image placeholder into the image's tokens and,
  asked with ``return_text_replacement_offsets``, reports where each expansion sits in the
  prompt string; the tokenizer's offset mapping turns those characters into tokens. R_k is
  that run (surrounding whitespace dropped), widened by one delimiter token on each side
  where the template writes the delimiters itself (e.g. Qwen's ``<|vision_start|>`` ..
  ``<|vision_end|>``: config or processor fields named ``*start*`` / ``*end*`` / ``boi`` /
  ``eoi``). A row this adapter never processed falls back to the runs of the image token
  ids (``processor.image_token_ids`` and the config's ``image_token_id`` /
  ``image_token_index``).
- **Λ.** Only the ``full_attention`` layers of the text config's ``layer_types`` (a sliding,
  chunked or linear layer's t_q row does not see every image); all layers without it.
- **Positions.** 1-D positions that skip the left padding; where the model computes its own
  multi-axis rope positions (it keeps ``rope_deltas``, as Qwen-style models do), the model
  computes them and cached label steps continue each row's text positions.
- **End of a label.** The token the chat template writes right after an assistant answer.

What a config says (image token id, delimiters, Λ, why it cannot be served) is read in
``app.models.conventions``; a processor AutoProcessor cannot build here is rebuilt in
``app.models.saved_processor``.
"""

from __future__ import annotations

import inspect
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from PIL import Image

from app.engine.adapter import PromptBatch
from app.engine.encoder_split import EncoderSplit, FirstDim
from app.models.base import HFAdapter, images_per_prompt
from app.models.conventions import (
    full_attention_layers,
    image_token_id,
    index_topk,
    is_delimiter_key,
    refusal,
)
from app.models.processor_probe import drops_the_prompt
from app.models.saved_processor import load_saved_processor

PROMPT_DROPPED = (
    "its processor writes prompts of its own in place of the text it is given (one per "
    "image), so a query over N images never reaches the model"
)
_SPAN_CACHE_ROWS = 256
_NOT_MODEL_INPUTS = ("offset_mapping", "labels")
"""Processor outputs no prompt forward takes: the offsets read here, and the training
labels some processors return with their token type ids (PaliGemma's)."""


class GenericAdapter(HFAdapter):
    """The default adapter: spans from the processor's own bookkeeping (module docstring)."""

    model_types: ClassVar[tuple[str, ...]] = ()
    chat_template_kwargs: ClassVar[dict[str, Any]] = {"enable_thinking": False}
    doc_layout: ClassVar[str] = "whatever the processor expands each image into (its own offsets)"
    doc_pixel_knob: ClassVar[str] = "the image processor's own size (no LAD_MAX_PIXELS)"
    # one pixel_values row per image when the call has exactly one per image, else uncached
    encoder_units: ClassVar[EncoderSplit | None] = FirstDim()

    def __init__(self, model: torch.nn.Module, processor: Any) -> None:
        super().__init__(model, processor)
        reason = refusal(self.config)
        if reason is not None:
            raise ValueError(f"cannot serve model_type {self.config.model_type!r}: {reason}")
        if drops_the_prompt(self):
            raise ValueError(
                f"cannot serve model_type {self.config.model_type!r}: {PROMPT_DROPPED}"
            )
        self._spans: OrderedDict[tuple[int, ...], list[tuple[int, int]]] = OrderedDict()
        self._lock = threading.Lock()
        self._end_id: int | None = None

    # ---- processor ------------------------------------------------------------------
    @classmethod
    def load_processor(
        cls, path: str, revision: str | None = None, trust_remote_code: bool = False
    ) -> Any:
        """The saved processor; where ``AutoProcessor`` cannot build it (its video processor
        needs torchvision), the class the checkpoint names, rebuilt from the saved parts
        (``app.models.saved_processor``)."""
        try:
            return super().load_processor(path, revision, trust_remote_code)
        except NotImplementedError:
            return load_saved_processor(path, revision, trust_remote_code)

    def process(
        self, prompts: Sequence[str], images: Sequence[Sequence[Image.Image]], **options: Any
    ) -> PromptBatch:
        """As the base, asking the processor where each image's expansion lies; the spans
        are kept (keyed by the row's tokens) for ``image_spans``."""
        asked = {
            "return_text_replacement_offsets": True,
            "return_offsets_mapping": True,
            "return_mm_token_type_ids": self._takes("mm_token_type_ids"),
        }
        flat = self.processor_images(images)
        try:
            out = self._call(prompts, flat, flat, {**asked, **options})
        except ValueError:  # processors that split images by prompt only when nested
            nested = images_per_prompt(images)
            out = self._call(prompts, nested, flat, {**asked, **options})
        except (TypeError, NotImplementedError):  # no offsets from this tokenizer
            return super().process(prompts, images, **options)
        offsets = out.get("offset_mapping")
        replaced = out.get("text_replacement_offsets")
        inputs = {
            k: v
            for k, v in out.items()
            if isinstance(v, torch.Tensor) and k not in _NOT_MODEL_INPUTS
        }
        batch = PromptBatch(inputs=inputs, n_images=[len(row) for row in images])
        if offsets is not None and replaced:
            for row, marks in enumerate(replaced):
                spans = self._spans_from_offsets(row, marks, offsets[row], batch)
                self._remember(batch.input_ids[row], batch.attention_mask[row], spans)
        return batch

    def _call(self, prompts: Sequence[str], images: Any, flat: Any, options: dict[str, Any]) -> Any:
        """The processor on ``images`` (flat or nested per prompt; ``flat``: the same RGB
        images in one list, for the per-call options)."""
        return self.processor(
            text=list(prompts),
            images=images,
            padding=True,
            padding_side="left",
            return_tensors="pt",
            **self.processor_kwargs(flat or []),
            **options,
        )

    def _spans_from_offsets(
        self, row: int, marks: Sequence[dict], offsets: torch.Tensor, batch: PromptBatch
    ) -> list[tuple[int, int]]:
        """Token spans of one row's image expansions (whitespace around them left out)."""
        starts, ends = offsets[:, 0].tolist(), offsets[:, 1].tolist()
        ids = batch.input_ids[row].tolist()
        mask = batch.attention_mask[row].tolist()
        delimiters = self._delimiter_ids()
        runs: list[tuple[int, int]] = []
        for mark in (m for m in marks if m.get("type") == "image"):
            text = mark["replacement"]
            lo = mark["new_span"][0] + (len(text) - len(text.lstrip()))
            hi = mark["new_span"][1] - (len(text) - len(text.rstrip()))
            inside = [
                i
                for i, (s, e) in enumerate(zip(starts, ends, strict=True))
                if mask[i] and e > s and s < hi and e > lo
            ]
            if inside:
                runs.append((inside[0], inside[-1] + 1))
        taken = {i for first, last in runs for i in range(first, last)}
        spans: list[tuple[int, int]] = []
        for first, last in runs:  # a delimiter the template wrote itself, next to the run
            if first > 0 and mask[first - 1] and ids[first - 1] in delimiters:
                first -= 1 if first - 1 not in taken else 0
            if last < len(ids) and ids[last] in delimiters and last not in taken:
                last += 1
            spans.append((first, last))
        return spans

    def _remember(
        self, input_ids: torch.Tensor, mask: torch.Tensor, spans: list[tuple[int, int]]
    ) -> None:
        real = input_ids[mask.bool()].tolist()
        offset = int((mask == 0).sum())  # left padding
        relative = [(s - offset, e - offset) for s, e in spans]
        with self._lock:
            self._spans[tuple(real)] = relative
            self._spans.move_to_end(tuple(real))
            while len(self._spans) > _SPAN_CACHE_ROWS:
                self._spans.popitem(last=False)

    def _takes(self, argument: str) -> bool:
        """Whether the model's forward names ``argument`` (token type ids the processor
        returns only when asked, and some models need)."""
        return argument in inspect.signature(self.model.forward).parameters

    # ---- structure ------------------------------------------------------------------
    def image_spans(self, input_ids: torch.Tensor, n_images: int) -> list[tuple[int, int]]:
        """R_k of one (padded, maybe folded) row: the processor's spans of that prompt where
        this adapter processed it, else the runs of image tokens."""
        ids = input_ids.tolist()
        with self._lock:
            known = list(self._spans.items())
        for real, relative in reversed(known):
            start = _find(ids, real)
            if start is not None and len(relative) == n_images:
                return [(s + start, e + start) for s, e in relative]
        return self._spans_from_ids(ids, n_images)

    def _image_ids(self) -> set[int]:
        listed = getattr(self.processor, "image_token_ids", None) or []
        found = {int(t) for t in listed if isinstance(t, int)}
        own = image_token_id(self.config)
        if own is None:  # the processor's, where the config leaves it unset
            own = getattr(self.processor, "image_token_id", None)
        if isinstance(own, int):
            found.add(int(own))
        return found

    def _delimiter_ids(self) -> set[int]:
        """Ids of the image delimiter tokens the config or the processor names."""
        found: set[int] = set()
        for owner in (self.config, self.processor):
            for key, value in vars(owner).items():
                if not is_delimiter_key(key):
                    continue
                if isinstance(value, int) and not isinstance(value, bool):
                    found.add(value)
                elif isinstance(value, str) and key.endswith("_token"):
                    tid = self.tokenizer.convert_tokens_to_ids(value)
                    if isinstance(tid, int) and tid != self.tokenizer.unk_token_id:
                        found.add(tid)
        return found - self._image_ids()

    def _closing_ids(self) -> set[int]:
        """Ids of the delimiters that close an image (``image_end_token``, ``eoi``): a run
        of image tokens ends after one, so images written back to back stay apart."""
        closing = re.compile(r"^(eoi|.*_?(end|close))_token")
        found: set[int] = set()
        for owner in (self.config, self.processor):
            for key, value in vars(owner).items():
                if not (is_delimiter_key(key) and closing.match(key)):
                    continue
                if isinstance(value, str):
                    value = self.tokenizer.convert_tokens_to_ids(value)
                if isinstance(value, int) and not isinstance(value, bool):
                    found.add(value)
        return found & self._delimiter_ids()

    def _spans_from_ids(self, ids: list[int], n_images: int) -> list[tuple[int, int]]:
        """Runs of image (and delimiter) tokens; exactly ``n_images`` of them or an error."""
        marked = self._image_ids() | self._delimiter_ids()
        closings = self._closing_ids()
        spans: list[tuple[int, int]] = []
        for i, token in enumerate(ids):
            if token not in marked:
                continue
            if spans and spans[-1][1] == i and ids[i - 1] not in closings:
                spans[-1] = (spans[-1][0], i + 1)
            else:
                spans.append((i, i + 1))
        if len(spans) != n_images:
            raise ValueError(f"expected {n_images} runs of image tokens, found {len(spans)}")
        return spans

    def attention_layers(self) -> tuple[int, ...]:
        return full_attention_layers(self.text_config())

    def attn_implementation(self, text: str, vision: str = "sdpa") -> dict[str, str]:
        """As the base, but a vision tower loaded on eager attention (it has no SDPA path:
        ``_supports_sdpa = False``, e.g. a VQ image tokenizer) stays on it."""
        chosen = super().attn_implementation(text, vision)
        if vision == "sdpa" and self.vision_attn_implementation() == "eager":
            chosen[self.vision_config_key] = "eager"
        return chosen

    def decoder_layers(self) -> Sequence[torch.nn.Module]:
        try:
            return super().decoder_layers()
        except NotImplementedError:
            decoder = self.model.get_decoder() if hasattr(self.model, "get_decoder") else None
            layers = getattr(decoder, "layers", None)
            if layers is None:
                raise
            return layers

    def context_length(self) -> int | None:
        """The base's limit, and no more than an indexed layer's ``index_topk``: past it the
        layer's softmax would cover only the keys its indexer picked, not every image."""
        limit = super().context_length()
        topk = index_topk(self.text_config())
        if topk is None:
            return limit
        return topk if limit is None else min(limit, topk)

    def end_token_id(self) -> int:
        """The token the chat template writes right after an assistant's answer (end of
        turn); the tokenizer's eos where the template shows none."""
        if self._end_id is None:
            self._end_id = self._template_end_id()
        return self._end_id

    def _template_end_id(self) -> int:
        answer = "7"
        messages = [
            *self.messages(1, "q"),
            {"role": "assistant", "content": [{"type": "text", "text": answer}]},
        ]
        try:
            text = self.processor.apply_chat_template(messages, tokenize=False)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            answer_id = self.tokenizer.convert_tokens_to_ids(answer)
            after = len(ids) - 1 - ids[::-1].index(answer_id)
            if after + 1 < len(ids):
                candidate = int(ids[after + 1])
                if candidate in set(self.tokenizer.all_special_ids):
                    return candidate
        except Exception:  # templates that refuse an assistant turn: the eos below
            pass
        return super().end_token_id()

    # ---- forward --------------------------------------------------------------------
    def _inner(self) -> torch.nn.Module:
        return getattr(self.model, "model", self.model)

    def _model_positions(self) -> bool:
        """Whether the model computes its own (multi-axis) rope positions."""
        return hasattr(self._inner(), "rope_deltas")

    def prompt_kwargs(self, batch: PromptBatch) -> dict[str, Any]:
        if not self._model_positions():
            return super().prompt_kwargs(batch)
        self._inner().rope_deltas = None  # the model recomputes them for this batch
        return dict(batch.inputs)

    def last_positions(self, batch: PromptBatch) -> torch.Tensor:
        real = batch.attention_mask.long().sum(-1) - 1
        deltas = getattr(self._inner(), "rope_deltas", None) if self._model_positions() else None
        if deltas is None:
            return real
        return real + deltas.reshape(-1).to(real.device)

    def decode_position_ids(self, last: torch.Tensor, depth: int) -> torch.Tensor:
        text = super().decode_position_ids(last, depth)
        if not self._model_positions():
            return text
        return text[None].expand(3, -1, -1)  # temporal, height, width axes alike


def _find(ids: list[int], real: tuple[int, ...]) -> int | None:
    """Start of ``real`` inside ``ids`` (a padded, maybe folded row), or None."""
    if not real or len(real) > len(ids):
        return None
    head = real[0]
    for start in range(len(ids) - len(real) + 1):
        if ids[start] == head and tuple(ids[start : start + len(real)]) == real:
            return start
    return None
