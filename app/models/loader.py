"""Load a model (hub name, local path or ``"demo"``), build its adapter, wrap it in a Runner.

This is where the family registry is consulted: the runner receives a built adapter.
The processor is loaded through the family adapter's ``load_processor``, which
falls back to rebuilding it from the saved tokenizer, image processor and chat
template when ``AutoProcessor`` cannot (e.g. no torchvision), so a saved
directory loads offline.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoConfig

from app.engine.runner import Runner
from app.models.registry import adapter_for

DEMO_MODEL_DIR = Path(__file__).resolve().parent.parent / "demo" / "model"

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}  # fmt: skip


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` -> cuda when available, else cpu."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(
    dtype: str | torch.dtype = "auto", device: torch.device | None = None
) -> torch.dtype:
    """``"auto"`` -> bfloat16 on cuda, float32 on cpu."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        on_cuda = device is not None and device.type == "cuda"
        return torch.bfloat16 if on_cuda else torch.float32
    try:
        return _DTYPES[dtype.removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use auto or one of {sorted(_DTYPES)}") from None


def _model_class(config: Any) -> Any:
    for name in getattr(config, "architectures", None) or ():
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    return transformers.AutoModelForImageTextToText


def make_runner(model: torch.nn.Module, processor: Any, **options: Any) -> Runner:
    """A Runner over an in-memory model and processor (tiny test models, training).

    The family adapter comes from the registry by ``model.config.model_type``; ``options``
    are the Runner's keyword arguments (model_id, revision, layers, prompt_variant, threads).
    """
    return Runner(adapter_for(model.config)(model, processor), **options)


def load_runner(
    model: str,
    *,
    revision: str | None = None,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    layers: Sequence[int] | None = None,
    prompt_variant: str = "vanilla",
    threads: int | None = None,
) -> Runner:
    """Load ``model`` (hub name, local directory, or ``"demo"``) and wrap it in a Runner.

    ``threads`` sets torch's intra-op thread count before loading (None: leave it).
    """
    if threads is not None:
        torch.set_num_threads(int(threads))
    source = str(DEMO_MODEL_DIR) if model == "demo" else model
    if model == "demo" and not (DEMO_MODEL_DIR / "config.json").is_file():
        raise FileNotFoundError(
            f"the demo model is missing at {DEMO_MODEL_DIR}; run `lad demo train`"
        )
    target = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, target)
    config = AutoConfig.from_pretrained(source, revision=revision)
    adapter_cls = adapter_for(config)  # fails early, listing supported types
    loaded = _model_class(config).from_pretrained(
        source, revision=revision, dtype=torch_dtype, attn_implementation="sdpa"
    )
    loaded = loaded.to(target).eval()
    processor = adapter_cls.load_processor(source, revision=revision)
    return Runner(
        adapter_cls(loaded, processor),
        model_id=model,
        revision=revision,
        layers=layers,
        prompt_variant=prompt_variant,
    )
