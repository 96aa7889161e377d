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

:func:`refusal` names why a config cannot be served (checked by the registry at load).
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
from app.models.processor_probe import drops_the_prompt

IMAGE_TOKEN_KEYS = ("image_token_id", "image_token_index")
"""Config fields holding the id of the image placeholder token."""
_DELIMITER_KEY = re.compile(
    r"^(boi|eoi|(image|vision|img)_?(start|end|begin|open|close))_token(_id|_index)?$"
)
_FULL_ATTENTION = "full_attention"
_INDEXED = "indexed_attention"
PROMPT_DROPPED = (
    "its processor writes prompts of its own in place of the text it is given (one per "
    "image), so a query over N images never reaches the model"
)
_SPAN_CACHE_ROWS = 256
_NOT_MODEL_INPUTS = ("offset_mapping", "labels")
"""Processor outputs no prompt forward takes: the offsets read here, and the training
labels some processors return with their token type ids (PaliGemma's)."""


def image_token_id(config: Any) -> int | None:
    """The config's image placeholder token id (top level, then the text config)."""
    for owner in (config, getattr(config, "text_config", None)):
        for key in IMAGE_TOKEN_KEYS:
            value = getattr(owner, key, None)
            if isinstance(value, int):
                return value
    return None


def _names_image_token(config: Any) -> bool:
    """Whether the config has an image token field at all (a default config may leave it
    None for the checkpoint to fill)."""
    owners = (config, getattr(config, "text_config", None))
    return any(
        hasattr(owner, key) for owner in owners if owner is not None for key in IMAGE_TOKEN_KEYS
    )


def refusal(config: Any) -> str | None:
    """Why the generic adapter cannot serve ``config`` (None: it can)."""
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder model: the images are not tokens of the decoder's sequence"
    text = getattr(config, "text_config", None) or config
    if getattr(text, "cross_attention_layers", None) or getattr(
        config, "cross_attention_layers", None
    ):
        return (
            "image features reach the text through cross-attention layers, not as tokens of "
            "the sequence (no image span to read attention over)"
        )
    if getattr(config, "canvas_length", None):
        return (
            "a diffusion language model: the answer is denoised on a canvas of "
            f"{config.canvas_length} tokens that reads the prompt's cache, not decoded token "
            "by token after the prompt (no next-token label scores to read)"
        )
    if not _names_image_token(config):
        return (
            "no image tokens in the sequence: the config names no image_token_id / "
            "image_token_index"
        )
    if _one_query_run_per_prompt(config):
        return (
            "one image per prompt: a Q-Former's num_query_tokens query tokens stand for the "
            "image, written once ahead of the text whatever the number of images, so the N "
            "images of a prompt cannot each have a span"
        )
    kinds = layer_kinds(text) if hasattr(text, "num_hidden_layers") else None
    if kinds is not None and not full_attention_layers(text):
        return (
            "no layer of layer_types is full_attention (it has "
            f"{', '.join(sorted(set(kinds)))}), so Λ (whole-prompt softmax layers) is empty"
        )
    return None


def _one_query_run_per_prompt(config: Any) -> bool:
    """A Q-Former model (BLIP-2, InstructBLIP): its processor writes ``num_query_tokens``
    image tokens once at the head of each prompt, however many images it is given."""
    queries = getattr(config, "num_query_tokens", None)
    has_qformer = getattr(config, "qformer_config", None) is not None
    return has_qformer and isinstance(queries, int) and not isinstance(queries, bool)


def _is_delimiter_key(key: str) -> bool:
    """``vision_start_token_id``, ``image_end_token``, ``boi_token_index`` ... (config or
    processor fields naming an image's opening or closing token)."""
    return _DELIMITER_KEY.match(key) is not None


def layer_kinds(text_config: Any) -> list[str] | None:
    """``layer_types`` of a text config, cut to its depth (None when it has none)."""
    kinds = getattr(text_config, "layer_types", None)
    if not kinds:
        return None
    return list(kinds)[: int(text_config.num_hidden_layers)]


def full_attention_layers(text_config: Any) -> tuple[int, ...]:
    """Layers whose softmax attention sees the whole prompt: the ``full_attention`` ones of
    ``layer_types`` (sliding layers too when the config has no window); all without it."""
    depth = int(text_config.num_hidden_layers)
    kinds = layer_kinds(text_config)
    if kinds is None:
        return tuple(range(depth))
    no_window = getattr(text_config, "sliding_window", None) is None
    indexed = index_topk(text_config) is not None
    return tuple(
        i
        for i, kind in enumerate(kinds)
        if kind == _FULL_ATTENTION
        or (no_window and kind == "sliding_attention")
        or (indexed and kind == _INDEXED)
    )


def index_topk(text_config: Any) -> int | None:
    """Keys an ``indexed_attention`` layer keeps per query (``index_topk``, DeepSeek-style
    sparse attention): its indexer picks the top k of the keys a query may see, so a
    sequence of at most k tokens keeps every key and the layer is full attention. None
    where the config names no such k."""
    kinds = layer_kinds(text_config) or []
    topk = getattr(text_config, "index_topk", None)
    if _INDEXED not in kinds or not isinstance(topk, int) or isinstance(topk, bool) or topk < 1:
        return None
    return topk


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
        needs torchvision), the class the checkpoint names (``processor_class``) built from
        the saved parts, with a stand-in video processor (no video is ever sent)."""
        from transformers import AutoTokenizer
        from transformers.processing_utils import ProcessorMixin

        from app.models.torchvision_stand_in import load_image_processor

        try:
            return super().load_processor(path, revision, trust_remote_code)
        except NotImplementedError:
            saved, _ = ProcessorMixin.get_processor_dict(path, revision=revision)
        processor_cls = processor_class_named(str(saved.get("processor_class")))
        options = {"revision": revision, "trust_remote_code": trust_remote_code}
        parts: dict[str, Any] = {
            "tokenizer": AutoTokenizer.from_pretrained(path, **options),
            "image_processor": load_image_processor(path, **options),
        }
        attributes = processor_cls.get_attributes()
        if "video_processor" in attributes:
            processor_cls = with_stand_in_video(processor_cls)
            parts["video_processor"] = stand_in_video_processor(parts["image_processor"])
        if "feature_extractor" in attributes:  # an audio front end (omni models)
            from transformers import AutoFeatureExtractor

            parts["feature_extractor"] = AutoFeatureExtractor.from_pretrained(path, **options)
        params = inspect.signature(processor_cls.__init__).parameters
        settings = {
            k: v for k, v in saved.items() if k in params and k not in parts and k not in attributes
        }
        settings["chat_template"] = parts["tokenizer"].chat_template or saved.get("chat_template")
        return processor_cls(**parts, **settings)

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
                if not _is_delimiter_key(key):
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
                if not (_is_delimiter_key(key) and closing.match(key)):
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


_STAND_INS: dict[type, type] = {}


def with_stand_in_video(processor_cls: type) -> type:
    """``processor_cls`` taking a plain ``BaseVideoProcessor`` as its video processor.

    The family's video processors need torchvision, which the service does not install, and
    no video is ever sent; the processor's own code (positional parts, its image and text
    expansion) runs unchanged. Same class name, so a saved processor names its family's
    class."""
    if processor_cls not in _STAND_INS:

        def check_argument_for_proper_class(self: Any, argument_name: str, argument: Any) -> Any:
            from transformers.video_processing_utils import BaseVideoProcessor

            if argument_name == "video_processor" and isinstance(argument, BaseVideoProcessor):
                return BaseVideoProcessor
            return processor_cls.check_argument_for_proper_class(self, argument_name, argument)

        namespace = {
            "check_argument_for_proper_class": check_argument_for_proper_class,
            "__module__": processor_cls.__module__,
            "__doc__": f"{processor_cls.__name__} with a stand-in video processor.",
        }
        _STAND_INS[processor_cls] = type(processor_cls.__name__, (processor_cls,), namespace)
    return _STAND_INS[processor_cls]


def stand_in_video_processor(image_processor: Any) -> Any:
    """A plain ``BaseVideoProcessor`` carrying the image processor's settings: a processor
    that reads its video processor's settings when built (MiniCPM-V's ``slice_mode``)
    finds the image side's, and no video is ever sent."""
    from transformers.video_processing_utils import BaseVideoProcessor

    video = BaseVideoProcessor()
    for key, value in vars(image_processor).items():
        if not key.startswith("_") and not hasattr(video, key):
            setattr(video, key, value)
    return video


def _adapter_classes(root: type) -> list[type]:
    """Every adapter class defined so far (the registry imports the families' modules)."""
    found = []
    for sub in root.__subclasses__():
        found.extend([sub, *_adapter_classes(sub)])
    return found


def processor_class_named(name: str) -> type:
    """The processor class a checkpoint names (a tiny build's ``...NoVideo`` subclass by its
    parent's name), torchvision-free where a family adapter has its own build of it (its
    ``processor_class``; the registry has imported the families before any load)."""
    import transformers

    name = name.removesuffix("NoVideo")
    for adapter in _adapter_classes(HFAdapter):  # e.g. Mistral 3's PixtralProcessor
        own = adapter.processor_class
        if own is not None and own.__name__ == name:
            return own
    processor_cls = getattr(transformers, name, None)
    if processor_cls is None or not hasattr(processor_cls, "get_attributes"):
        raise ValueError(f"the checkpoint names no processor class transformers has ({name!r})")
    return processor_cls


def _find(ids: list[int], real: tuple[int, ...]) -> int | None:
    """Start of ``real`` inside ``ids`` (a padded, maybe folded row), or None."""
    if not real or len(real) > len(ids):
        return None
    head = real[0]
    for start in range(len(ids) - len(real) + 1):
        if ids[start] == head and tuple(ids[start : start + len(real)]) == real:
            return start
    return None
