"""COCO captions: the annotation JSON (``images``: id + file_name, ``annotations``: image_id +
caption) and the image folder; optionally the instances JSON for category sets, so that
adversarial negatives never share the target's exact set of categories (DESIGN §2.7)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lad_lab.eval.datasets.base import ImagePool, InputError, PoolImage, read_json
from lad_lab.eval.datasets.coco_paper import AuthorsPool


def read_coco(captions: Path, images_dir: Path, instances: Path | None = None) -> list[PoolImage]:
    """The captioned images of a COCO captions file, in image-id order."""
    doc = _coco(captions, "COCO captions JSON", ("image_id", "caption"))
    texts: dict[int, list[str]] = defaultdict(list)
    for ann in doc["annotations"]:
        texts[int(ann["image_id"])].append(str(ann["caption"]).strip())
    categories: dict[int, set[int]] | None = None
    if instances is not None:
        categories = defaultdict(set)
        for ann in _coco(instances, "COCO instances JSON", ("image_id", "category_id"))[
            "annotations"
        ]:
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


def _coco(path: Path, what: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """A COCO annotation file whose annotations carry ``keys`` (else one line saying so)."""
    doc = read_json(path, what)
    annotations = doc.get("annotations") if isinstance(doc, dict) else None
    if not isinstance(annotations, list) or not isinstance(doc.get("images", []), list):
        raise InputError(f'{path}: no "annotations" list; the {what} is COCO\'s own file')
    for number, ann in enumerate(annotations):
        if not isinstance(ann, dict) or any(k not in ann for k in keys):
            raise InputError(
                f"{path}: annotation {number} lacks {' or '.join(keys)}; the {what} is "
                "COCO's own file"
            )
    return doc


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
    dataset = ImagePool("coco", pool, neighbours, **rule)
    dataset.source = str(captions)
    return dataset


def authors_coco_dataset(
    captions: Path,
    images_dir: Path,
    instances: Path | None,
    embed: Callable[[list[Path]], np.ndarray] | None = None,
    text_embed: Callable[[list[str]], np.ndarray] | None = None,
) -> AuthorsPool:
    """The authors' construction (``coco_paper``) over the images whose file exists."""
    if instances is None:
        raise InputError(
            "--benchmark paper needs --instances (COCO's instances JSON: the category sets)"
        )
    pool = [p for p in read_coco(captions, images_dir, instances) if p.path.is_file()]
    dataset = AuthorsPool("coco", pool, embed, text_embed)
    dataset.source = str(captions)
    return dataset
