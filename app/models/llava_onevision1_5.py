"""LLaVA-OneVision-1.5 (``llavaonevision1_5``: Rice ViT + a Qwen3 decoder, remote code).

Written from the checkpoints' published config, processor layout and the structure of
their ``modeling_llavaonevision1_5.py`` (read, not copied); never run against the real
weights here (docs/models.md says what was and was not tested). What it takes from them:

- Prompt layout as Qwen2.5-VL: a ChatML template, each image as
  ``<|vision_start|> <|image_pad|>*n_k <|vision_end|>`` (the Qwen vocabulary's ids
  151652 / 151655 / 151653), one image token per 28 x 28 pixels (patch 14, merge 2), and
  a Qwen2-VL-style image processor (the same pixel-budget rule). R_k is found by the
  delimiter strings: the published config names no ``vision_end_token_id``.
- Text positions are plain 1-D: the model's forward feeds ``position_ids`` straight to a
  1-D rotary embedding (it defines a 3-D ``get_rope_index`` but never calls it). So the
  defaults of :class:`HFAdapter` apply: positions from the mask's cumulative sum (left
  padding honoured), label tokens continuing from t_q.
- Its attention classes are chosen per implementation when the model is built (eager /
  sdpa / flash-attention-2) and do not go through transformers' attention interface, so
  the ``lad_capture`` SDPA path cannot see them: ``capture = "eager_hook"``. Its SDPA
  class falls back to its eager code for a call with ``output_attentions=True``, which
  is what the eager hook asks of the layers of Λ only; the other layers stay on SDPA.
- Its forward takes a fixed list of arguments (no ``**kwargs``, no ``logits_to_keep``):
  the prompt kwargs are narrowed to what it takes, and ``logits_to_keep`` is honoured by
  cutting the hidden states before the LM head (``KeptLogits``), so the prompt forward
  never builds (B, T, V) logits. That list names the cache ``past_key_values``, so the
  ``cache`` that transformers 5.24's ``generate`` passes is handed to it under that name.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import torch

from app.engine.adapter import PromptBatch
from app.engine.attention import EAGER_HOOK_CAPTURE
from app.engine.kv_cache import CACHE, cache_argument
from app.models.base import HFAdapter
from app.models.qwen2_vl import Qwen2VLAdapter


class KeptLogits:
    """``logits_to_keep`` for a model whose forward does not take it: a pre-hook on the model
    takes the argument out of the call, and a pre-hook on its LM head keeps only the last
    ``k`` positions of the hidden states for that call."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.keep: int | None = None
        model.register_forward_pre_hook(self._take, with_kwargs=True)
        model.register_forward_hook(self._clear)
        model.get_output_embeddings().register_forward_pre_hook(self._cut)

    def _take(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        keep = kwargs.pop("logits_to_keep", None)
        self.keep = int(keep) if keep else None
        return args, kwargs

    def _cut(self, module: torch.nn.Module, args: tuple) -> tuple | None:
        if self.keep is None:
            return None
        return (args[0][:, -self.keep :, :], *args[1:])

    def _clear(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        self.keep = None


def rename_cache(model: torch.nn.Module, name: str) -> None:
    """A pre-hook on the model passing ``generate``'s cache (transformers 5.24 calls it
    ``cache``) under ``name``, the one its fixed argument list takes (``past_key_values``)."""

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if CACHE in kwargs:
            kwargs[name] = kwargs.pop(CACHE)
        return args, kwargs

    model.register_forward_pre_hook(hook, with_kwargs=True)


class LlavaOneVision15Adapter(Qwen2VLAdapter):
    model_types: ClassVar[tuple[str, ...]] = ("llavaonevision1_5",)
    capture: ClassVar[str] = EAGER_HOOK_CAPTURE
    doc_layout: ClassVar[str] = (
        "`<|vision_start|>` `<|image_pad|>`×n `<|vision_end|>` per image (Qwen ids), 1-D "
        "text positions"
    )
    doc_pixel_knob: ClassVar[str] = "`LAD_MAX_PIXELS` / `LAD_MIN_PIXELS` (28 × 28 per token)"
    doc_tested: ClassVar[str] = (
        "stand-in only: a Qwen2.5-VL build with its config values, processor layout and "
        "forward signature, loaded as remote code; never the real checkpoint"
    )

    def __init__(self, model: torch.nn.Module, processor: Any) -> None:
        super().__init__(model, processor)
        parameters = inspect.signature(model.forward).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
        self._forward_args = None if takes_any else frozenset(parameters)
        if self._forward_args is not None and "logits_to_keep" not in self._forward_args:
            KeptLogits(model)
        if self._forward_args is not None and CACHE not in self._forward_args:
            rename_cache(model, cache_argument(model.forward))

    def image_spans(self, input_ids: torch.Tensor, n_images: int) -> list[tuple[int, int]]:
        return HFAdapter.image_spans(self, input_ids, n_images)

    def prompt_kwargs(self, batch: PromptBatch) -> dict[str, Any]:
        """The processor's tensors the forward takes, plus 1-D positions that skip the left
        padding (repeated images are not deduplicated: the model takes no encoder outputs)."""
        kwargs = HFAdapter.prompt_kwargs(self, batch)
        if self._forward_args is None:
            return kwargs
        return {key: value for key, value in kwargs.items() if key in self._forward_args}

    def last_positions(self, batch: PromptBatch) -> torch.Tensor:
        return HFAdapter.last_positions(self, batch)

    def decode_position_ids(self, last: torch.Tensor, depth: int) -> torch.Tensor:
        return HFAdapter.decode_position_ids(self, last, depth)
