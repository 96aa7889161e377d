"""CLIP image embeddings for the adversarial negatives of the image datasets (DESIGN §2.7).

transformers' ``CLIPModel`` and ``CLIPImageProcessor`` from a local directory (``--clip
PATH``; nothing is downloaded). Embeddings are L2-normalised and cached as one ``.npy``
per (model, image list) under the cache directory (``np.save`` without pickle), so a
second run of the same dataset reads them back instead of running CLIP again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from app.eval.datasets.base import open_image

BATCH = 32


def cache_file(clip: Path, paths: Sequence[Path], cache_dir: Path) -> Path:
    """Where the embeddings of ``paths`` under the model at ``clip`` are cached."""
    digest = hashlib.sha256()
    for part in (str(Path(clip).resolve()), *(str(p) for p in paths)):
        digest.update(part.encode())
        digest.update(b"\x00")
    config = Path(clip) / "config.json"
    if config.is_file():
        digest.update(config.read_bytes())
    return Path(cache_dir) / f"clip_{digest.hexdigest()[:24]}.npy"


def compute_embeddings(clip: Path, paths: Sequence[Path]) -> np.ndarray:
    """(P, D) float32 L2-normalised CLIP image embeddings."""
    import torch
    from transformers import CLIPImageProcessor, CLIPModel

    model = CLIPModel.from_pretrained(clip).eval()
    processor = CLIPImageProcessor.from_pretrained(clip)
    chunks = []
    with torch.inference_mode():
        for start in range(0, len(paths), BATCH):
            images = [open_image(p) for p in paths[start : start + BATCH]]
            pixels = processor(images=images, return_tensors="pt")["pixel_values"]
            features = model.get_image_features(pixel_values=pixels)
            if not isinstance(features, torch.Tensor):  # an output object in some versions
                features = features.pooler_output
            chunks.append(torch.nn.functional.normalize(features.float(), dim=-1).numpy())
    return np.concatenate(chunks).astype(np.float32)


def clip_embeddings(clip: Path, paths: Sequence[Path], cache_dir: Path) -> np.ndarray:
    """The cached embeddings when present, else computed and cached."""
    target = cache_file(clip, paths, cache_dir)
    if target.is_file():
        cached = np.load(target, allow_pickle=False)
        if cached.shape[0] == len(paths):
            return cached
    embeddings = compute_embeddings(clip, paths)
    target.parent.mkdir(parents=True, exist_ok=True)
    np.save(target, embeddings, allow_pickle=False)
    return embeddings
