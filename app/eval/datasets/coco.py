"""COCO captions: the annotation JSON (``images``: id + file_name, ``annotations``: image_id +
caption) and the image folder; optionally the instances JSON for category sets, so that
adversarial negatives never share the target's exact set of categories (DESIGN §2.7)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from app.eval.datasets.base import ImagePool, PoolImage


def read_coco(captions: Path, images_dir: Path, instances: Path | None = None) -> list[PoolImage]:
    """The captioned images of a COCO captions file, in image-id order."""
    doc = json.loads(Path(captions).read_text())
    texts: dict[int, list[str]] = defaultdict(list)
    for ann in doc.get("annotations", []):
        texts[int(ann["image_id"])].append(str(ann["caption"]).strip())
    categories: dict[int, set[int]] | None = None
    if instances is not None:
        categories = defaultdict(set)
        for ann in json.loads(Path(instances).read_text()).get("annotations", []):
            categories[int(ann["image_id"])].add(int(ann["category_id"]))
    pool = []
    for image in sorted(doc.get("images", []), key=lambda im: int(im["id"])):
        image_id = int(image["id"])
        if texts.get(image_id):
            cats = None if categories is None else frozenset(categories.get(image_id, ()))
            pool.append(
                PoolImage(Path(images_dir) / image["file_name"], tuple(texts[image_id]), cats)
            )
    return pool


def coco_dataset(
    captions: Path,
    images_dir: Path,
    instances: Path | None = None,
    embed: Callable[[list[Path]], np.ndarray] | None = None,
    **rule: Any,
) -> ImagePool:
    """``embed`` (paths -> L2-normalised embeddings) enables the adversarial setting; ``rule``:
    ImagePool's negative rule and text embedding."""
    pool = read_coco(captions, images_dir, instances)
    neighbours = None if embed is None else (lambda: embed([p.path for p in pool]))
    return ImagePool("coco", pool, neighbours, **rule)
