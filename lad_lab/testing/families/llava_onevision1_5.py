"""A stand-in for LLaVA-OneVision-1.5 (its weights and code cannot be had here).

Built from transformers' own Qwen2.5-VL classes, narrowed to what the published
checkpoint shows of itself: ``model_type`` ``llavaonevision1_5``; the Qwen ChatML
template with ``<|vision_start|><|image_pad|><|vision_end|>`` per image; patch 14 and merge
2; grouped heads 4 : 1 (32 : 8 in the 8B); plain 1-D text positions (2-D ``position_ids``
make Qwen2.5-VL's rope 1-D, as the real model's is); and a forward with the fixed argument list
of the published ``modeling_llavaonevision1_5.py`` (no ``**kwargs``, no ``logits_to_keep``,
no ``mm_token_type_ids``). Not mirrored: the Rice ViT tower (the stand-in keeps
Qwen2.5-VL's, with two temporal patches where Rice has one) and the Qwen3 decoder's
q/k norms. Its attention still goes through transformers' interface; the adapter serves
it through the eager-hook capture all the same, as it would the real one.

:func:`save_remote_code_checkpoint` writes it as a remote-code checkpoint (``auto_map`` and
two small Python files that import these classes), so ``LAD_TRUST_REMOTE_CODE`` loading
runs through transformers' dynamic-module machinery.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from app.engine.kv_cache import cache_argument
from lad_lab.testing.families.qwen import build_qwen2

MODEL_TYPE = "llavaonevision1_5"


class StandInConfig(Qwen2_5_VLConfig):
    model_type = MODEL_TYPE


class StandInForConditionalGeneration(Qwen2_5_VLForConditionalGeneration):
    """Qwen2.5-VL behind the published LLaVA-OneVision-1.5 forward signature."""

    config_class = StandInConfig

    def forward(  # the published argument list: no **kwargs, no logits_to_keep
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        pixel_values: torch.Tensor | None = None,
        pixel_values_videos: torch.Tensor | None = None,
        image_grid_thw: torch.Tensor | None = None,
        video_grid_thw: torch.Tensor | None = None,
        rope_deltas: torch.Tensor | None = None,
        cache_position: torch.Tensor | None = None,
    ) -> Any:
        if position_ids is None:  # as published: positions from the cache, never 3-D
            start = past_key_values.get_seq_length() if past_key_values is not None else 0
            length = (input_ids if input_ids is not None else inputs_embeds).shape[1]
            position_ids = torch.arange(start, start + length).unsqueeze(0)
        # the parent by the cache name its transformers version defines (5.24: ``cache``)
        parent = super().forward
        return parent(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **{cache_argument(parent): past_key_values},
            inputs_embeds=inputs_embeds,
            labels=labels,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            pixel_values=pixel_values,
            image_grid_thw=image_grid_thw,
            cache_position=cache_position,
        )


def build(seed: int = 0, **overrides: Any) -> tuple[torch.nn.Module, Any]:
    """The stand-in and its processor: the tiny Qwen2.5-VL build (its weights, its Qwen
    processor and vocabulary) behind the OV-1.5 classes; 12 decoder layers by default
    (Λ = 7..11) and grouped heads 4 : 1."""
    overrides.setdefault("num_hidden_layers", 12)
    overrides.setdefault("num_key_value_heads", 1)
    qwen, processor = build_qwen2("qwen2_5_vl", seed=seed, **overrides)
    fields = qwen.config.to_dict()
    for key in ("model_type", "architectures", "transformers_version"):
        fields.pop(key, None)
    model = StandInForConditionalGeneration(StandInConfig(**fields)).to(qwen.dtype).eval()
    model.load_state_dict(qwen.state_dict())
    return model, processor


def save_remote_code_checkpoint(directory: Path, seed: int = 0, **overrides: Any) -> Path:
    """The stand-in saved as a remote-code checkpoint: loading it needs trust_remote_code."""
    model, processor = build(seed=seed, **overrides)
    model.config.auto_map = {
        "AutoConfig": "configuration_llavaonevision1_5.StandInConfig",
        "AutoModelForCausalLM": "modeling_llavaonevision1_5.StandInForConditionalGeneration",
    }
    model.config.architectures = ["StandInForConditionalGeneration"]
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    here = "lad_lab.testing.families.llava_onevision1_5"
    (directory / "configuration_llavaonevision1_5.py").write_text(
        f"from {here} import StandInConfig\n"
    )
    (directory / "modeling_llavaonevision1_5.py").write_text(
        f"from {here} import StandInForConditionalGeneration\n"
    )
    return directory
