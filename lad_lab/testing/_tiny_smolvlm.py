"""Tiny random SmolVLM: the Idefics3 builder with SmolVLM's classes and processor
(``lad_lab.testing._tiny_idefics3``; the two families share their image layout)."""

from __future__ import annotations

from typing import Any

import torch

from lad_lab.testing import _tiny_idefics3


def build(*, seed: int = 0, **overrides: Any) -> tuple[torch.nn.Module, Any]:
    """(model, processor) of a tiny SmolVLMForConditionalGeneration."""
    return _tiny_idefics3.build("smolvlm", seed=seed, **overrides)
