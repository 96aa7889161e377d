"""A model's identity (app.engine.identity): its served name's default, and config and
weights hashes that follow what the model is, not where or how it was saved or loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from app.engine.identity import SAMPLES_PER_TENSOR, config_hash, served_name, weights_hash
from calibration_store import Fingerprint
from calibration_store.profile import IDENTITY_FIELDS


def test_served_name_defaults_to_the_hub_id_or_the_directorys_name(tmp_path: Path) -> None:
    checkpoint = tmp_path / "models" / "gemma3"
    checkpoint.mkdir(parents=True)
    assert served_name(str(checkpoint)) == "gemma3"
    assert served_name(f"{checkpoint}/") == "gemma3"
    assert served_name("google/gemma-3-4b-it") == "google/gemma-3-4b-it"  # not a directory
    assert served_name("demo") == "demo"
    assert served_name(str(checkpoint), "my-gemma") == "my-gemma"


class _Config:
    def __init__(self, **values: object) -> None:
        self.values = values

    def to_dict(self) -> dict[str, object]:
        return dict(self.values)


def test_the_config_hash_ignores_how_the_model_was_saved_and_loaded() -> None:
    base = {"model_type": "qwen2_5_vl", "hidden_size": 64, "text_config": {"layers": 2}}
    same = {
        **base,
        "_name_or_path": "/elsewhere/ckpt",
        "transformers_version": "5.24.0",
        "dtype": "bfloat16",
        "text_config": {"layers": 2, "_attn_implementation": "sdpa", "dtype": "float32"},
    }
    assert config_hash(_Config(**base)) == config_hash(_Config(**same))
    other = {**base, "text_config": {"layers": 3}}
    assert config_hash(_Config(**base)) != config_hash(_Config(**other))


def test_the_weights_hash_follows_the_weights() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    before = weights_hash(model)
    copy = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    copy.load_state_dict(model.state_dict())
    assert weights_hash(copy) == before  # the same weights in another object
    with torch.no_grad():
        model[1].bias[3] += 1e-3  # a small tensor is hashed whole
    assert weights_hash(model) != before
    big = torch.nn.Linear(256, 256)  # 65536 entries > SAMPLES_PER_TENSOR
    assert big.weight.numel() > SAMPLES_PER_TENSOR
    hashed = weights_hash(big)
    with torch.no_grad():
        big.weight.mul_(1.01)  # a fine-tune moves every entry of what it trains
    assert weights_hash(big) != hashed


def _fingerprint(**changes: object) -> Fingerprint:
    fields = {
        "model_id": "ckpt",
        "dtype": "float32",
        "attention_backend": "sdpa",
        "prompt_hash": "p",
        "label_scheme": "digits",
        "n": 3,
        "config_hash": "c1",
        "weights_hash": "w1",
    }
    return Fingerprint(**{**fields, **changes})


@pytest.mark.parametrize("field", IDENTITY_FIELDS)
def test_identity_is_compared_when_both_recorded_it(field: str) -> None:
    engine = _fingerprint()
    assert _fingerprint().mismatches(engine) == {}
    assert _fingerprint(**{field: "other"}).mismatches(engine) == {
        field: ("other", getattr(engine, field))
    }
    assert _fingerprint(**{field: None}).mismatches(engine) == {}  # written before it existed
