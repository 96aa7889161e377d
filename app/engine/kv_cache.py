"""The name under which a model takes and returns its KV cache.

transformers 5.24 renamed the forward argument and the output field ``past_key_values`` to
``cache`` (the old name warns, and goes in 5.40); 5.23 knows only ``past_key_values``, and
so does remote code with a fixed argument list (LLaVA-OneVision-1.5). The runner asks the
model's own forward signature, so every supported version gets the name it defines.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

CACHE = "cache"
LEGACY_CACHE = "past_key_values"


def cache_argument(forward: Callable[..., Any]) -> str:
    """``cache`` where the forward names it (or takes only ``**kwargs``), else the legacy
    ``past_key_values`` it names. The signature follows transformers' deprecation wrapper
    (``functools.wraps``) to the function it wraps."""
    parameters = inspect.signature(forward).parameters
    if CACHE not in parameters and LEGACY_CACHE in parameters:
        return LEGACY_CACHE
    return CACHE


def cache_entry(mapping: Any) -> Any:
    """The cache in a forward's output (or keyword arguments) under either name, read as a
    mapping entry: the legacy ``output.past_key_values`` property of transformers 5.24 warns."""
    for name in (CACHE, LEGACY_CACHE):
        if name in mapping:
            return mapping[name]
    return None
