"""Dataset readers of ``lad eval``: one small module each, all producing ``EvalItem`` lists.

    synthetic  the demo world (Random, Adversarial)              no files
    jsonl      your data: {"query", "images": [paths], "answer"}  --data FILE
    coco       COCO captions JSON + image folder                  --data CAPTIONS --images DIR
               (+ --instances JSON for category sets; --benchmark paper: the authors'
               construction, lad_lab.eval.datasets.coco_paper)
    flickr     Flickr8k/30k captions file + image folder          --data CAPTIONS --images DIR
    simulated  a score-level SIMULATION of the paper's regime     no files, no model
               (its own backend: lad_lab.eval.datasets.simulated)

Adversarial negatives of coco/flickr need ``--clip PATH`` (a local CLIP directory).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from lad_lab.eval.datasets.base import (
    Dataset,
    EvalItem,
    InputError,
    check_disjoint,
    check_images,
    open_image,
)

DATASETS: tuple[str, ...] = ("synthetic", "jsonl", "coco", "flickr", "simulated")
DEFAULT_SETTINGS: dict[str, str] = {
    "synthetic": "random",
    "jsonl": "given",
    "coco": "random",
    "flickr": "random",
    "simulated": "adversarial",
}


def open_dataset(
    name: str,
    *,
    data: Path | None = None,
    images: Path | None = None,
    instances: Path | None = None,
    clip: Path | None = None,
    cache_dir: Path = Path("var/cache"),
    image_size: int | None = None,
    negatives: str = "ours",
    benchmark: str = "ours",
) -> Dataset:
    """The reader of ``name`` over its files (InputError naming what is missing);
    ``negatives``: the exclusion rule of coco/flickr negatives (``base.NEGATIVE_RULES``);
    ``benchmark``: "paper" builds COCO items as the authors do (``coco_paper``)."""
    if name == "synthetic":
        from lad_lab.eval.datasets.synthetic import SyntheticDataset

        return SyntheticDataset(image_size) if image_size else SyntheticDataset()
    if name == "simulated":
        from lad_lab.eval.datasets.simulated import SimulatedDataset

        return SimulatedDataset()
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; use one of {DATASETS}")
    if data is None:
        raise InputError(f"dataset {name!r} needs --data (the annotation file)")
    if name == "jsonl":
        from lad_lab.eval.datasets.jsonl import JsonlDataset

        return JsonlDataset(data)
    if images is None:
        raise InputError(f"dataset {name!r} needs --images (the image folder)")
    if not Path(images).is_dir():
        raise InputError(f"{images}: no such folder (--images, the image folder of {data})")
    embed = text_embed = None
    if clip is not None:
        from lad_lab.eval.datasets.clip import clip_embeddings, clip_text_embeddings

        embed = partial(clip_embeddings, clip, cache_dir=cache_dir)
        text_embed = partial(clip_text_embeddings, clip, cache_dir=cache_dir)
    rule = {"rule": negatives, "text_embed": text_embed}
    if benchmark == "paper":
        if name != "coco":
            raise InputError(f"--benchmark paper is the authors' COCO construction, not {name}")
        from lad_lab.eval.datasets.coco import authors_coco_dataset

        return authors_coco_dataset(data, images, instances, embed, text_embed)
    if name == "coco":
        from lad_lab.eval.datasets.coco import coco_dataset

        return coco_dataset(data, images, instances, embed, **rule)
    from lad_lab.eval.datasets.flickr import flickr_dataset

    return flickr_dataset(data, images, embed, **rule)


__all__ = [
    "DATASETS",
    "DEFAULT_SETTINGS",
    "Dataset",
    "EvalItem",
    "InputError",
    "check_disjoint",
    "check_images",
    "open_dataset",
    "open_image",
]
