"""The default answers of an HF-native MLLM family to the engine's adapter questions.

A *family adapter* is the only place in the code that knows how one MLLM family lays
out a multi-image prompt. The engine is written against the protocol
``app.engine.adapter.FamilyAdapter``; :class:`HFAdapter` answers it the way most
transformers MLLMs need, and a family is one file that subclasses it, overrides what
differs and is listed in the registry (``app.models.registry``).

Token spans are half-open ``(start, end)`` indices into the *padded* row, and
include the family's delimiter tokens (e.g. Qwen ``<|vision_start|>`` ..
``<|vision_end|>``) so that a_k^(l) sums over everything that belongs to image k.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from PIL import Image

from app.engine.adapter import PromptBatch
from app.engine.encoder_split import EncoderSplit


class HFAdapter:
    """Default answers shared by HF-native MLLMs; families override what differs."""

    model_types: ClassVar[tuple[str, ...]] = ()
    text_config_key: ClassVar[str] = "text_config"
    vision_config_key: ClassVar[str] = "vision_config"
    image_delimiters: ClassVar[tuple[str, str] | None] = None
    # token that closes the assistant turn; used after a label as its end-of-sequence
    end_token: ClassVar[str | None] = None
    # processor class the parts-based rebuild constructs (None: no rebuild possible)
    processor_class: ClassVar[type | None] = None
    # processor_config.json keys the parts-based rebuild needs (e.g. image token counts)
    processor_settings: ClassVar[tuple[str, ...]] = ()
    # extra variables of the chat template (e.g. enable_thinking=False: answer, do not think)
    chat_template_kwargs: ClassVar[dict[str, Any]] = {}
    # "sdpa": rows captured inside transformers' SDPA call; "eager_hook": the fallback for
    # attention that bypasses transformers' attention interface (app.engine.attention)
    capture: ClassVar[str] = "sdpa"
    # documentation (docs/models.md family table): the image-token layout in one line, the knob
    # that bounds the tokens per image, and what was tested
    doc_layout: ClassVar[str] = ""
    doc_pixel_knob: ClassVar[str] = ""
    doc_tested: ClassVar[str] = ""
    # how the pixel inputs split into independently encoded units (app.engine.encoder_split);
    # None: the family's image features bypass the encoder cache
    encoder_units: ClassVar[EncoderSplit | None] = None

    def __init__(self, model: torch.nn.Module, processor: Any) -> None:
        self.model = model
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.config = model.config

    # ---- processor ---------------------------------------------------------------
    @classmethod
    def load_processor(
        cls, path: str, revision: str | None = None, trust_remote_code: bool = False
    ) -> Any:
        """The saved processor; when ``AutoProcessor`` cannot build it (e.g. no
        torchvision for a video processor), rebuild it from its saved parts and the
        saved ``processor_settings``."""
        from transformers import (
            AutoProcessor,
            AutoTokenizer,
            PreTrainedTokenizerBase,
        )
        from transformers.processing_utils import ProcessorMixin

        from app.models.torchvision_stand_in import load_image_processor

        options = {"revision": revision, "trust_remote_code": trust_remote_code}
        try:
            processor = AutoProcessor.from_pretrained(path, **options)
        except Exception:  # any failure here has the parts-based fallback below
            processor = None
        if hasattr(processor, "image_processor") and hasattr(processor, "tokenizer"):
            return processor
        if isinstance(processor, PreTrainedTokenizerBase):  # AutoProcessor fell back to it
            tokenizer = processor  # (a 150k-token vocabulary takes seconds to read again)
        else:
            tokenizer = AutoTokenizer.from_pretrained(path, **options)
        image_processor = load_image_processor(path, **options)
        settings: dict[str, Any] = {}
        if cls.processor_settings:
            saved, _ = ProcessorMixin.get_processor_dict(path, revision=revision)
            settings = {key: saved[key] for key in cls.processor_settings if key in saved}
        return cls.processor_from_parts(
            image_processor, tokenizer, tokenizer.chat_template, **settings
        )

    @classmethod
    def set_pixel_budget(
        cls, processor: Any, max_pixels: int | None, min_pixels: int | None
    ) -> str | None:
        """Bound each image's pixels, and so its image tokens (LAD_MAX_PIXELS,
        LAD_MIN_PIXELS), on a loaded processor. Returns what the budget now is, for the
        log; None when the family has no such setting (the default)."""
        return None

    @classmethod
    def processor_from_parts(
        cls, image_processor: Any, tokenizer: Any, chat_template: str | None, **settings: Any
    ) -> Any:
        """A ``processor_class`` from an image processor, a tokenizer, a chat template
        and the saved settings."""
        if cls.processor_class is None:
            raise NotImplementedError(
                f"{cls.__name__} cannot rebuild a processor from parts; AutoProcessor failed"
            )
        return cls.processor_class(
            image_processor=image_processor,
            tokenizer=tokenizer,
            chat_template=chat_template,
            **settings,
        )

    # ---- prompt -------------------------------------------------------------------
    def messages(self, n_images: int, text: str) -> list[dict[str, Any]]:
        """One user turn: the N images first, in order, then one text part (DESIGN §2.6)."""
        content: list[dict[str, Any]] = [{"type": "image"} for _ in range(n_images)]
        content.append({"type": "text", "text": text})
        return [{"role": "user", "content": content}]

    def render(self, n_images: int, text: str) -> str:
        """The prompt string through the model's chat template, generation prompt added."""
        template = self.chat_template()  # its own variables only: others go to the processor
        extra = {k: v for k, v in self.chat_template_kwargs.items() if k in template}
        return self.processor.apply_chat_template(
            self.messages(n_images, text), tokenize=False, add_generation_prompt=True, **extra
        )

    def chat_template(self) -> str:
        """The chat template string (part of the prompt hash)."""
        template = getattr(self.processor, "chat_template", None)
        if template is None:
            template = getattr(self.tokenizer, "chat_template", None)
        if isinstance(template, dict):
            template = template.get("default", next(iter(template.values()), ""))
        return template or ""

    def process(
        self, prompts: Sequence[str], images: Sequence[Sequence[Image.Image]], **options: Any
    ) -> PromptBatch:
        """Run the processor on a batch, padding on the LEFT so the last token is t_q;
        ``options`` go to the processor call (a family's per-call settings)."""
        flat = self.processor_images(images)
        out = self.processor(
            text=list(prompts),
            images=flat,
            padding=True,
            padding_side="left",
            return_tensors="pt",
            **self.processor_kwargs(flat or []),
            **options,
        )
        inputs = {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}
        return PromptBatch(inputs=inputs, n_images=[len(row) for row in images])

    def processor_images(self, images: Sequence[Sequence[Image.Image]]) -> Any:
        """The ``images`` argument of the processor call: one flat RGB list, None if empty
        (RGB images as they are: ``convert`` would copy their pixels for nothing)."""
        flat = [img if img.mode == "RGB" else img.convert("RGB") for row in images for img in row]
        return flat or None

    def processor_kwargs(self, images: Sequence[Image.Image]) -> dict[str, Any]:
        """Extra processor options for these (RGB) images: none in general; families whose
        processor would redo what decode already did override this."""
        return {}

    def image_size_for(self, width: int, height: int) -> tuple[int, int] | None:
        """Not known in general (families with a known rule override this)."""
        return None

    def image_pixel_budget(self) -> int | None:
        """Most pixels of one image the processor uses: its fixed ``height x width`` times the
        tiles it may cut (``max_patches`` when it crops to patches); None when it says
        neither. Families with another rule (Qwen's pixel range) override this."""
        image_processor = getattr(self.processor, "image_processor", None)
        size = getattr(image_processor, "size", None)
        height, width = size_field(size, "height"), size_field(size, "width")
        if not height or not width:
            return None
        tiles = 1
        if getattr(image_processor, "crop_to_patches", False):
            tiles = max(1, int(getattr(image_processor, "max_patches", 1) or 1))
        return int(height) * int(width) * tiles

    # ---- structure ----------------------------------------------------------------
    def image_spans(self, input_ids: torch.Tensor, n_images: int) -> list[tuple[int, int]]:
        """R_k for one row: ``n_images`` half-open token ranges, delimiters included.

        Default: pair up the family's opening/closing delimiter tokens.
        """
        if self.image_delimiters is None:
            raise NotImplementedError(f"{type(self).__name__} must define image_spans")
        open_id, close_id = (self.token_id(t) for t in self.image_delimiters)
        ids = input_ids.tolist()
        starts = [i for i, t in enumerate(ids) if t == open_id]
        ends = [i + 1 for i, t in enumerate(ids) if t == close_id]
        spans = list(zip(starts, ends, strict=False))
        if len(starts) != n_images or len(ends) != n_images or any(s >= e for s, e in spans):
            raise ValueError(
                f"expected {n_images} image spans delimited by {self.image_delimiters}, "
                f"found {len(starts)} openings and {len(ends)} closings"
            )
        return spans

    def text_config(self) -> Any:
        """The language model's config (holds layers, heads, vocabulary)."""
        return getattr(self.config, self.text_config_key, None) or self.config

    def num_layers(self) -> int:
        """L, the number of decoder layers of the text model."""
        return int(self.text_config().num_hidden_layers)

    def attention_layers(self) -> tuple[int, ...]:
        """The decoder layers whose softmax attention sees the whole prompt (every image): the
        only layers Λ may hold. Default: all of them; hybrid families (linear-attention or
        sliding-window layers) override this from their config."""
        return tuple(range(self.num_layers()))

    def decoder_layers(self) -> Sequence[torch.nn.Module]:
        """The text model's decoder layers (``language_model.layers`` where transformers'
        MLLMs keep them)."""
        for owner in (getattr(self.model, "model", None), self.model):
            language_model = getattr(owner, "language_model", None)
            layers = getattr(language_model, "layers", None)
            if layers is not None:
                return layers
        raise NotImplementedError(f"{type(self).__name__} must say where its decoder layers are")

    def attention_modules(self) -> Sequence[torch.nn.Module | None]:
        """Each decoder layer's self-attention module, in layer order (None for a layer
        without one, e.g. a linear-attention layer)."""
        return [getattr(layer, "self_attn", None) for layer in self.decoder_layers()]

    def context_length(self) -> int | None:
        """Most tokens in one sequence: the text model's ``max_position_embeddings`` (None
        when the config has none). A family whose limit is elsewhere overrides this."""
        limit = getattr(self.text_config(), "max_position_embeddings", None)
        return int(limit) if limit else None

    def token_id(self, token: str) -> int:
        """Id of a single (special) token; raises if the tokenizer does not know it."""
        tid = self.tokenizer.convert_tokens_to_ids(token)
        is_unknown = tid == getattr(self.tokenizer, "unk_token_id", None)
        if tid is None or (is_unknown and token != self.tokenizer.unk_token):
            raise ValueError(f"token {token!r} is not in the vocabulary")
        return int(tid)

    def end_token_id(self) -> int:
        """The token the model writes right after a label (end of turn), the trie's EOS."""
        if self.end_token is not None:
            return self.token_id(self.end_token)
        eos = self.tokenizer.eos_token_id
        if eos is None:
            raise ValueError("tokenizer has no eos token")
        return int(eos)

    # ---- forward ------------------------------------------------------------------
    def prompt_kwargs(self, batch: PromptBatch) -> dict[str, Any]:
        """Model kwargs of the prompt forward.

        Default: the processor's tensors plus 1-D positions that skip the left
        padding (cumsum of the mask), so a padded row sees the same positions as
        the same prompt alone.
        """
        kwargs: dict[str, Any] = dict(batch.inputs)
        kwargs["position_ids"] = self._padded_positions(batch.attention_mask)
        return kwargs

    @staticmethod
    def _padded_positions(mask: torch.Tensor) -> torch.Tensor:
        positions = mask.long().cumsum(-1) - 1
        return positions.masked_fill(mask == 0, 1)

    def last_positions(self, batch: PromptBatch) -> torch.Tensor:
        """(B,) text position of t_q; call right after the prompt forward."""
        return batch.attention_mask.long().sum(-1) - 1

    def decode_position_ids(self, last: torch.Tensor, depth: int) -> torch.Tensor:
        """Positions of ``depth`` label tokens fed after the prompt of rows with t_q at ``last``."""
        steps = torch.arange(1, depth + 1, device=last.device)
        return last[:, None] + steps[None, :]

    def attn_implementation(self, text: str, vision: str = "sdpa") -> dict[str, str]:
        """Argument of ``model.set_attn_implementation``: capture path for text only."""
        return {self.text_config_key: text, self.vision_config_key: vision}

    def text_attn_implementation(self) -> str | None:
        return getattr(self.text_config(), "_attn_implementation", None)

    def encoder_split(self) -> EncoderSplit | None:
        """The family's split for the encoder cache (``encoder_units``)."""
        return self.encoder_units

    def vision_attn_implementation(self) -> str | None:
        vision = getattr(self.config, self.vision_config_key, None)
        return getattr(vision, "_attn_implementation", None)


def images_per_prompt(images: Sequence[Sequence[Image.Image]]) -> list[list[Image.Image]] | None:
    """The ``images`` argument for processors that take them nested per prompt (they do not
    split a flat list by the prompts' placeholders): RGB images as they are, None if empty."""
    nested = [[img if img.mode == "RGB" else img.convert("RGB") for img in row] for row in images]
    return nested if any(nested) else None


def longest_edge_budget(processor: Any) -> int | None:
    """Most pixels of one image for processors that bound only its longest edge
    (``size["longest_edge"]``): a square of that edge. None when there is no such bound."""
    size = getattr(getattr(processor, "image_processor", None), "size", None)
    edge = size_field(size, "longest_edge")
    return int(edge) ** 2 if edge else None


def size_field(size: Any, key: str) -> Any:
    """One field of an image processor's ``size`` (a dict or transformers' SizeDict)."""
    if size is None:
        return None
    return size.get(key) if isinstance(size, dict) else getattr(size, key, None)


def without_video_processor(processor_cls: type, name: str, module: str) -> type:
    """A subclass of a family's processor that is built without its video processor.

    The video processors need torchvision, which the service does not install. The
    subclass's ``__init__`` signature is the parent's minus ``video_processor``, so
    ``save_pretrained`` still writes every setting the parent names and ``from_pretrained``
    loads no video processor (transformers reads the signature for both). Family settings
    other than the chat template reach it as keywords (``HFAdapter.processor_from_parts``).
    """
    parent = inspect.signature(processor_cls.__init__)

    def __init__(
        self: Any,
        image_processor: Any = None,
        tokenizer: Any = None,
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("video_processor", None)
        processor_cls.__init__(  # keywords: some processors take their parts in another order
            self,
            image_processor=image_processor,
            tokenizer=tokenizer,
            video_processor=None,
            chat_template=chat_template,
            **kwargs,
        )

    params = [p for key, p in parent.parameters.items() if key != "video_processor"]
    __init__.__signature__ = parent.replace(parameters=params)  # type: ignore[attr-defined]
    doc = f"{processor_cls.__name__} without the video processor (which needs torchvision)."
    namespace = {"__init__": __init__, "__doc__": doc, "__module__": module}
    return type(name, (processor_cls,), namespace)
