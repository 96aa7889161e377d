"""Random models of the released architectures (``shape:<family>-<size>``), for benchmarks.

Compute cost does not depend on the weights' values, so a randomly initialised model with
a released checkpoint's depth, heads, KV heads, widths, vocabulary size and vision tower
costs what the checkpoint costs, and nothing has to be downloaded. The architecture
values are transcribed from each checkpoint's public ``config.json`` into
``lad_lab/testing/shapes/<name>.json`` (with the address they come from); the tokenizer and
the special-token ids are the in-code ones of the tiny builds (``lad_lab.testing.tiny_base``,
``lad_lab.testing.families``: the ids do not change the cost; the embedding and the output
layer keep the real vocabulary size).

``width`` narrows the hidden size of the text model to ``width`` and every other width
(MLP, vision tower) by the same factor, keeping depth, head counts, KV heads, and the
image processor (so token counts) as released: the capture of a real Λ (15 layers of a
36-layer Qwen2.5-VL-3B) can then be timed on a CPU. Head sizes shrink by the factor and
must stay whole and even; the vision tower's head size is rounded up to a multiple of 4
(its 2-D rotary embedding needs that).
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path
from typing import Any

import torch

SHAPES_DIR = Path(__file__).with_name("shapes")
PREFIX = "shape:"


def shape_names() -> tuple[str, ...]:
    """Every recorded architecture, e.g. ``qwen2_5_vl-3b``."""
    return tuple(sorted(p.stem for p in SHAPES_DIR.glob("*.json")))


@cache
def load_shape(name: str) -> dict[str, Any]:
    """The recorded architecture ``name`` (``qwen2_5_vl-3b``; a ``shape:`` prefix is allowed)."""
    name = name.removeprefix(PREFIX)
    path = SHAPES_DIR / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"unknown shape {name!r}; recorded: {', '.join(shape_names())}")
    return json.loads(path.read_text())


def _head_dim(hidden: int, heads: int, what: str, multiple: int = 2) -> int:
    if hidden % heads or (hidden // heads) % multiple:
        raise ValueError(
            f"{what}: width {hidden} over {heads} heads is not a whole head size divisible by "
            f"{multiple}; choose a width that is a multiple of {heads * multiple}"
        )
    return hidden // heads


def narrow(shape: dict[str, Any], width: int | None) -> dict[str, Any]:
    """``shape`` with the text hidden size ``width`` and every width scaled by the same
    factor (depth, heads, KV heads, vocabulary and vision geometry kept); None: as is."""
    if width is None:
        return shape
    text, vision = dict(shape["text_config"]), dict(shape["vision_config"])
    factor = width / text["hidden_size"]
    if factor > 1:
        raise ValueError(f"width {width} is above the released {text['hidden_size']}")
    old_head = text["hidden_size"] // text["num_attention_heads"]
    new_head = _head_dim(width, text["num_attention_heads"], "text model")
    text["hidden_size"] = width
    text["intermediate_size"] = max(1, round(text["intermediate_size"] * factor))
    if "mrope_section" in text:  # (temporal, height, width) split of head_dim / 2, scaled
        _, height, wide = (s * new_head // old_head for s in text["mrope_section"])
        temporal = new_head // 2 - height - wide
        if min(temporal, height, wide) < 1:
            raise ValueError(f"width {width}: head size {new_head} is too small for mrope")
        text["mrope_section"] = [temporal, height, wide]
    heads = vision.get("num_heads", vision.get("num_attention_heads"))
    per_head = 4 * math.ceil(vision["hidden_size"] * factor / heads / 4)
    vision["hidden_size"] = per_head * heads
    vision["intermediate_size"] = max(1, round(vision["intermediate_size"] * factor))
    return {**shape, "text_config": text, "vision_config": vision, "width": width}


def _instantiate(model_cls: Any, config: Any, seed: int, dtype: torch.dtype, device: str) -> Any:
    """The random model built in ``dtype`` directly on ``device`` (a full-size 7B model
    would not fit a CPU's memory in float32 on the way to a GPU in bf16)."""
    torch.manual_seed(seed)
    with torch.device(device):
        return model_cls._from_config(config, dtype=dtype).eval()


def _qwen(shape: dict[str, Any], seed: int, dtype: torch.dtype, device: str) -> tuple[Any, Any]:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    from app.models.qwen2_vl import Qwen2_5_VLProcessorNoVideo
    from lad_lab.testing.families.qwen import (
        QWEN_CHAT_TEMPLATE,
        QWEN_SPECIAL_TOKENS,
        qwen_token_ids,
    )
    from lad_lab.testing.tiny_base import byte_level_tokenizer

    tokenizer = byte_level_tokenizer(QWEN_SPECIAL_TOKENS, ranked=True)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}
    text = dict(shape["text_config"])
    rope = {
        "rope_type": "default",
        "rope_theta": text.pop("rope_theta"),
        "mrope_section": text.pop("mrope_section"),
    }
    text.update(
        rope_parameters=rope,
        bos_token_id=None,
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    vision = {**shape["vision_config"], "out_hidden_size": text["hidden_size"]}
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        **qwen_token_ids(ids),
        tie_word_embeddings=text["tie_word_embeddings"],
    )
    processor = Qwen2_5_VLProcessorNoVideo(
        image_processor=Qwen2VLImageProcessorPil(),  # the released pixel range
        tokenizer=tokenizer,
        chat_template=QWEN_CHAT_TEMPLATE,
    )
    return _instantiate(Qwen2_5_VLForConditionalGeneration, config, seed, dtype, device), processor


def _text_config(shape: dict[str, Any], tokenizer: Any) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(
        **shape["text_config"],
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _internvl(shape: dict[str, Any], seed: int, dtype: torch.dtype, device: str) -> tuple[Any, Any]:
    from transformers import (
        GotOcr2ImageProcessorPil,
        InternVLConfig,
        InternVLForConditionalGeneration,
        InternVLVisionConfig,
    )

    from app.models.internvl import InternVLProcessorNoVideo
    from lad_lab.testing.families.internvl import CHAT_TEMPLATE, NAMED_TOKENS
    from lad_lab.testing.tiny_base import byte_level_tokenizer

    tokenizer = byte_level_tokenizer(list(NAMED_TOKENS.values()), NAMED_TOKENS)
    side = shape["vision_config"]["image_size"][0]
    processor = InternVLProcessorNoVideo(
        image_processor=GotOcr2ImageProcessorPil(
            size={"height": side, "width": side}, crop_to_patches=False
        ),
        tokenizer=tokenizer,
        image_seq_length=shape["image_seq_length"],
        chat_template=CHAT_TEMPLATE,
    )
    config = InternVLConfig(
        vision_config=InternVLVisionConfig(**shape["vision_config"]),
        text_config=_text_config(shape, tokenizer),
        image_token_id=processor.image_token_id,
        image_seq_length=shape["image_seq_length"],
        downsample_ratio=shape["downsample_ratio"],
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        tie_word_embeddings=False,
    )
    return _instantiate(InternVLForConditionalGeneration, config, seed, dtype, device), processor


def _llava_onevision(
    shape: dict[str, Any], seed: int, dtype: torch.dtype, device: str
) -> tuple[Any, Any]:
    from transformers import (
        LlavaOnevisionConfig,
        LlavaOnevisionForConditionalGeneration,
        LlavaOnevisionImageProcessorPil,
        SiglipVisionConfig,
    )

    from app.models.llava_onevision import LlavaOnevisionProcessorNoVideo
    from lad_lab.testing.families.llava_onevision import CHAT_TEMPLATE
    from lad_lab.testing.tiny_base import byte_level_tokenizer

    tokenizer = byte_level_tokenizer(["<image>", "<video>"])
    vision = shape["vision_config"]
    side, patch = vision["image_size"], vision["patch_size"]
    processor = LlavaOnevisionProcessorNoVideo(
        image_processor=LlavaOnevisionImageProcessorPil(
            size={"height": side, "width": side}, image_grid_pinpoints=[[side, side]]
        ),
        tokenizer=tokenizer,
        num_image_tokens=(side // patch) ** 2,
        vision_feature_select_strategy="full",
        chat_template=CHAT_TEMPLATE,
        vision_aspect_ratio="anyres_max_9",
    )
    config = LlavaOnevisionConfig(
        vision_config=SiglipVisionConfig(**vision),
        text_config=_text_config(shape, tokenizer),
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        video_token_index=tokenizer.convert_tokens_to_ids("<video>"),
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        image_grid_pinpoints=[[side, side]],
        vision_aspect_ratio="anyres_max_9",
        tie_word_embeddings=False,
    )
    model = _instantiate(LlavaOnevisionForConditionalGeneration, config, seed, dtype, device)
    return model, processor


_BUILDERS = {"qwen2_5_vl": _qwen, "internvl": _internvl, "llava_onevision": _llava_onevision}


def build_shape(
    name: str,
    *,
    width: int | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> tuple[torch.nn.Module, Any]:
    """(model, processor) of the recorded architecture ``name``, random weights, optionally
    narrowed to ``width`` (see the module docstring), built on ``device`` in ``dtype``."""
    shape = narrow(load_shape(name), width)
    return _BUILDERS[shape["family"]](shape, seed, dtype, device)


def shape_runner(name: str, *, width: int | None = None, seed: int = 0, **build: Any) -> Any:
    """A Runner over ``build_shape`` (model id ``shape:<name>``, ``@w<width>`` if narrowed);
    ``build`` passes ``dtype`` and ``device`` on."""
    from app.models.loader import make_runner

    model, processor = build_shape(name, width=width, seed=seed, **build)
    model_id = PREFIX + name.removeprefix(PREFIX) + (f"@w{width}" if width else "")
    return make_runner(model, processor, model_id=model_id)
