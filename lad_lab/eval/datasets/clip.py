"""CLIP embeddings for the adversarial negatives of the image datasets (design §2.7, §2.11).

transformers' ``CLIPModel`` with its ``CLIPImageProcessor`` (image neighbours) and its
tokenizer (the paper rule's caption cosine) from a local directory (``--clip PATH``, e.g.
a saved openai/clip-vit-large-patch14; nothing is downloaded). Embeddings are
L2-normalised and cached as one ``.npy`` per (model, inputs) under the cache directory
(``np.save`` without pickle), so a second run reads them back instead of running CLIP.
CLIP runs on the service's device (``LAD_DEVICE``: cuda when available).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from lad_lab.eval.datasets.base import open_image

BATCH = 32


def cache_file(clip: Path, paths: Sequence[Path | str], cache_dir: Path, kind: str = "") -> Path:
    """Where the embeddings of ``paths`` (or texts, ``kind="text"``) under ``clip`` are cached."""
    digest = hashlib.sha256(kind.encode())
    for part in (str(Path(clip).resolve()), *(str(p) for p in paths)):
        digest.update(part.encode())
        digest.update(b"\x00")
    config = Path(clip) / "config.json"
    if config.is_file():
        digest.update(config.read_bytes())
    return Path(cache_dir) / f"clip_{digest.hexdigest()[:24]}.npy"


def _device() -> object:
    """The device ``lad serve`` would put a model on (LAD_DEVICE)."""
    from app.models.loader import resolve_device
    from app.settings import Settings

    return resolve_device(Settings().device)


def compute_embeddings(clip: Path, paths: Sequence[Path]) -> np.ndarray:
    """(P, D) float32 L2-normalised CLIP image embeddings."""
    import torch
    from transformers import CLIPImageProcessor, CLIPModel

    device = _device()
    model = CLIPModel.from_pretrained(clip).eval().to(device)
    processor = CLIPImageProcessor.from_pretrained(clip)
    chunks = []
    with torch.inference_mode():
        for start in range(0, len(paths), BATCH):
            images = [open_image(p) for p in paths[start : start + BATCH]]
            pixels = processor(images=images, return_tensors="pt")["pixel_values"].to(device)
            features = model.get_image_features(pixel_values=pixels)
            if not isinstance(features, torch.Tensor):  # an output object in some versions
                features = features.pooler_output
            chunks.append(torch.nn.functional.normalize(features.float(), dim=-1).cpu().numpy())
    return np.concatenate(chunks).astype(np.float32)


def compute_text_embeddings(clip: Path, texts: Sequence[str]) -> np.ndarray:
    """(P, D) float32 L2-normalised CLIP text embeddings (truncated to CLIP's context)."""
    import torch
    from transformers import AutoTokenizer, CLIPModel

    device = _device()
    model = CLIPModel.from_pretrained(clip).eval().to(device)
    tokenizer = AutoTokenizer.from_pretrained(clip)
    context = int(model.config.text_config.max_position_embeddings)
    chunks = []
    with torch.inference_mode():
        for start in range(0, len(texts), BATCH):
            batch = tokenizer(
                list(texts[start : start + BATCH]),
                padding=True,
                truncation=True,
                max_length=context,
                return_tensors="pt",
            )
            features = model.get_text_features(
                input_ids=batch["input_ids"].to(device),
                attention_mask=batch["attention_mask"].to(device),
            )
            if not isinstance(features, torch.Tensor):
                features = features.pooler_output
            chunks.append(torch.nn.functional.normalize(features.float(), dim=-1).cpu().numpy())
    return np.concatenate(chunks).astype(np.float32)


def _cached(target: Path, count: int, compute: Callable[[], np.ndarray]) -> np.ndarray:
    if target.is_file():
        cached = np.load(target, allow_pickle=False)
        if cached.shape[0] == count:
            return cached
    embeddings = compute()
    target.parent.mkdir(parents=True, exist_ok=True)
    np.save(target, embeddings, allow_pickle=False)
    return embeddings


def clip_embeddings(clip: Path, paths: Sequence[Path], cache_dir: Path) -> np.ndarray:
    """The cached image embeddings when present, else computed and cached."""
    target = cache_file(clip, paths, cache_dir)
    return _cached(target, len(paths), lambda: compute_embeddings(clip, paths))


def clip_text_embeddings(clip: Path, texts: Sequence[str], cache_dir: Path) -> np.ndarray:
    """The cached caption embeddings when present, else computed and cached."""
    target = cache_file(clip, texts, cache_dir, kind="text")
    return _cached(target, len(texts), lambda: compute_text_embeddings(clip, texts))
