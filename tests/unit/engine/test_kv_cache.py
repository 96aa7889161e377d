"""The KV cache's name per transformers version and per forward signature (app/engine/kv_cache)."""

from __future__ import annotations

import warnings
from typing import Any

import torch
import transformers
from packaging.version import Version
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

from app.engine.kv_cache import CACHE, LEGACY_CACHE, cache_argument, cache_entry

RENAMED_IN = Version("5.24")


def tiny_qwen2() -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    return Qwen2ForCausalLM(config).eval()


def test_an_in_library_model_gets_the_name_its_transformers_defines() -> None:
    want = CACHE if Version(transformers.__version__) >= RENAMED_IN else LEGACY_CACHE
    assert cache_argument(tiny_qwen2().forward) == want


def test_a_fixed_legacy_signature_gets_past_key_values_and_kwargs_only_gets_cache() -> None:
    def remote(input_ids: Any = None, past_key_values: Any = None, use_cache: Any = None) -> None:
        return None

    def open_ended(**kwargs: Any) -> None:
        return None

    def both(cache: Any = None, past_key_values: Any = None) -> None:
        return None

    assert cache_argument(remote) == LEGACY_CACHE
    assert cache_argument(open_ended) == CACHE
    assert cache_argument(both) == CACHE


def test_a_cached_step_under_that_name_warns_nothing_and_extends_the_cache() -> None:
    model = tiny_qwen2()
    name = cache_argument(model.forward)
    ids = torch.tensor([[1, 2, 3]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            out = model(input_ids=ids, use_cache=True, **{name: DynamicCache()})
            cache = cache_entry(out)
            assert isinstance(cache, DynamicCache) and cache.get_seq_length() == 3
            step = model(input_ids=torch.tensor([[4]]), use_cache=True, **{name: cache})
    assert cache_entry(step).get_seq_length() == 4


def test_cache_entry_reads_either_name_and_none_without_one() -> None:
    marker = object()
    assert cache_entry({LEGACY_CACHE: marker}) is marker
    assert cache_entry({CACHE: marker, LEGACY_CACHE: None}) is marker
    assert cache_entry({"logits": 1}) is None
