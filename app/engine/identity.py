"""What a model *is*, independent of where its files lie: the name it is served under, and
hashes of its configuration and of its weights (stored in every profile's fingerprint).

A profile is keyed by the served name, so a checkpoint copied or remounted elsewhere keeps
its profiles; the hashes make a different model served under the same name refuse them
(``profile_mismatch``). Both hashes read the loaded model, not its files, so they do not
depend on the directory, the file format (safetensors or bin) or the sharding.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

HASH_CHARS = 16
"""Hex characters kept of each sha256 (64 bits: enough to tell two checkpoints apart)."""

SAMPLES_PER_TENSOR = 1024
"""Entries of each weight tensor hashed (evenly spaced; every entry of a smaller tensor)."""

VOLATILE_CONFIG_KEYS = frozenset(
    {"transformers_version", "dtype", "torch_dtype", "attn_implementation", "use_cache"}
)
"""Config entries that say how a model was saved or loaded, not what it is (keys starting
with ``_``, such as ``_name_or_path``, are left out too)."""


def served_name(model: str, served: str | None = None) -> str:
    """The name a model is served under: ``served`` when set, else a local directory's own
    name (``/models/gemma3`` -> ``gemma3``) or the hub id / ``demo`` as given."""
    if served:
        return served
    path = Path(model)
    if model != "demo" and path.exists():
        return path.resolve().name or model
    return model


def _stable(value: Any) -> Any:
    """The config without its volatile entries, at every depth (sub-model configs)."""
    if isinstance(value, dict):
        return {
            k: _stable(v)
            for k, v in value.items()
            if not str(k).startswith("_") and k not in VOLATILE_CONFIG_KEYS
        }
    if isinstance(value, list | tuple):
        return [_stable(v) for v in value]
    return value


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:HASH_CHARS]


def config_hash(config: Any) -> str:
    """sha256 of the model's configuration (``config.to_dict()``), volatile entries left out."""
    stable = _stable(config.to_dict())
    return _digest(json.dumps(stable, sort_keys=True, default=str).encode())


@torch.inference_mode()
def weights_hash(model: torch.nn.Module) -> str:
    """sha256 over every state-dict tensor's name, shape and up to SAMPLES_PER_TENSOR evenly
    spaced entries (as float32). A fine-tune changes the entries of the tensors it trains,
    so it hashes differently; the cost is a few small copies per tensor, not a pass over
    the whole checkpoint. A tensor without data (the meta device of an offloaded layer)
    counts by its name and shape only."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(f"{name}:{tuple(tensor.shape)};".encode())
        if tensor.device.type == "meta" or tensor.numel() == 0:
            continue
        flat = tensor.detach().reshape(-1)
        if flat.numel() > SAMPLES_PER_TENSOR:
            at = torch.linspace(0, flat.numel() - 1, SAMPLES_PER_TENSOR, dtype=torch.float64).long()
            flat = flat[at.to(flat.device)]
        digest.update(flat.to("cpu", torch.float32).numpy().tobytes())
    return digest.hexdigest()[:HASH_CHARS]
