"""Checks of ``scripts/reproduce_paper.sh`` before anything runs: every checkpoint (config
readable, weights present, remote code allowed where it is needed) and every input path,
one line each, so that a missing permission or a wrong path stops the script before the
first model has spent hours, not after.

Nothing here loads weights or imports a checkpoint's code: config.json is read as JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Check:
    """One line of the pre-flight report."""

    ok: bool
    line: str


def checkpoint_dir(model: str) -> Path | None:
    """The folder of a checkpoint: "demo", a local folder, or a hub name already in the
    local cache (nothing is downloaded); None when it is none of these."""
    from app.models.loader import DEMO_MODEL_DIR

    if model == "demo":
        return Path(DEMO_MODEL_DIR)
    if Path(model).is_dir():
        return Path(model)
    if Path(model).exists() or model.count("/") > 1:
        return None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, local_files_only=True))
    except Exception:  # not cached, offline, or not a repo name: all "absent"
        return None


def _weights(folder: Path) -> tuple[list[Path], list[str]]:
    """(weight files, shards an index names but the folder lacks)."""
    files = sorted([*folder.glob("*.safetensors"), *folder.glob("pytorch_model*.bin")])
    missing: list[str] = []
    for index in folder.glob("*.index.json"):
        try:
            shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        except (OSError, ValueError):
            shards = set()
        missing += sorted(s for s in shards if not (folder / s).is_file())
    return files, missing


def needs_remote_code(config: dict) -> bool:
    """The checkpoint maps its classes to its own Python files (``auto_map``) and
    transformers has none of its architectures: loading it runs that code."""
    import transformers

    architectures = config.get("architectures") or []
    return bool(config.get("auto_map")) and not any(
        hasattr(transformers, name) for name in architectures
    )


def check_model(key: str, model: str, trust_remote_code: bool) -> Check:
    """One checkpoint: readable config, weights on disk, remote code allowed if needed."""
    folder = checkpoint_dir(model)
    if folder is None:
        return Check(
            False, f"{key}: {model} is neither a folder nor in the hub cache; fix the path"
        )
    config_file = folder / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        return Check(False, f"{key}: {config_file} unreadable ({exc}); not a checkpoint folder")
    files, missing = _weights(folder)
    if missing or not files:
        what = f"shards {', '.join(missing[:3])} missing" if missing else "no weight files"
        return Check(False, f"{key}: {folder}: {what} (*.safetensors / pytorch_model*.bin)")
    remote = needs_remote_code(config)
    if remote and not trust_remote_code:
        return Check(
            False,
            f"{key}: {folder} runs its own Python code (auto_map); allow it with "
            "LAD_TRUST_REMOTE_CODE=true, only for a checkpoint you trust",
        )
    from lad_lab.eval.protocol_record import model_depth

    size = sum(f.stat().st_size for f in files) / 1e9
    return Check(
        True,
        f"{key}: ok ({config.get('model_type', '?')}, {model_depth(str(folder)) or '?'} "
        f"layers, {size:.2f} GB of weights, remote code {'allowed' if remote else 'not needed'})",
    )


def check_path(flag: str, path: Path | None, kind: str, required: bool = True) -> Check | None:
    """One input path: a file or a folder that exists (None: an optional flag not given)."""
    if path is None:
        return Check(False, f"{flag}: missing; it is required") if required else None
    if kind == "checkpoint folder":  # a saved transformers model: its config.json
        good = (Path(path) / "config.json").is_file()
    else:
        good = Path(path).is_dir() if kind == "folder" else Path(path).is_file()
    if good:
        return Check(True, f"{flag} {path}: ok")
    return Check(False, f"{flag} {path}: no such {kind}; fix the path")
