"""Each distinct image through the image processor and the vision tower once per batch,
however often it appears.

A ``perm_avg`` request (and a calibration) runs the N cyclic rotations of one image list
as one batch, so the batch holds every image N times; without this the image processor
resizes, rescales, normalises and patchifies each of them N times, and the vision tower
encodes each of them N times (about half of a small model's forward). Images are the same
when they are the same object (the rotations share the decoded images), so no pixel is
compared or hashed.

Valid for processors whose image output is ``pixel_values`` (the patches of all images,
concatenated) with ``image_grid_thw`` (one row per image: its patches = t·h·w), i.e. the
Qwen2-VL family; any other output goes through the processor unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

_PATCHED = "_lad_unique_images"


def _take(values: Any, order: list[int]) -> Any:
    if isinstance(values, torch.Tensor):
        return values[torch.tensor(order, dtype=torch.long)]
    if isinstance(values, np.ndarray):
        return values[order]
    return [values[i] for i in order]


def _concat(chunks: list[Any]) -> Any:
    if isinstance(chunks[0], torch.Tensor):
        return torch.cat(chunks)
    if isinstance(chunks[0], np.ndarray):
        return np.concatenate(chunks)
    return [row for chunk in chunks for row in chunk]


def unique_image_processing(process: Callable[..., tuple[Any, list]]) -> Callable:
    """Wrap a processor's ``_process_images(images, **kwargs) -> (features, replacements)``."""

    def _process_images(images: Any, **kwargs: Any) -> tuple[Any, list]:
        if not isinstance(images, list) or len({id(im) for im in images}) == len(images):
            return process(images, **kwargs)
        index: dict[int, int] = {}
        unique = []
        for image in images:
            if id(image) not in index:
                index[id(image)] = len(unique)
                unique.append(image)
        features, replacements = process(unique, **kwargs)
        if set(features.keys()) != {"pixel_values", "image_grid_thw"}:
            return process(images, **kwargs)  # an output this does not know how to reorder
        grid = features["image_grid_thw"]
        sizes = [int(np.prod(np.asarray(row))) for row in grid]
        bounds = np.cumsum([0, *sizes]).tolist()
        pixels = features["pixel_values"]
        chunks = [pixels[bounds[i] : bounds[i + 1]] for i in range(len(unique))]
        order = [index[id(image)] for image in images]
        features["pixel_values"] = _concat([chunks[i] for i in order])
        features["image_grid_thw"] = _take(grid, order)
        return features, [replacements[i] for i in order]

    setattr(_process_images, _PATCHED, True)
    return _process_images


def install(processor: Any) -> bool:
    """Make ``processor`` process repeated images once (True if it could be installed)."""
    process = getattr(processor, "_process_images", None)
    if process is None or getattr(process, _PATCHED, False):
        return process is not None
    processor._process_images = unique_image_processing(process)
    return True


def image_sources(images: Sequence[Any]) -> list[int] | None:
    """For each image of a flat batch, the index of its first occurrence (the same object);
    None when every image is distinct, i.e. when there is nothing to share."""
    first: dict[int, int] = {}
    sources = [first.setdefault(id(image), i) for i, image in enumerate(images)]
    return None if len(first) == len(sources) else sources


def unique_image_features(
    model: Any, pixel_values: torch.Tensor, grid_thw: torch.Tensor, sources: list[int]
) -> Any:
    """The vision tower's output for a batch with repeated images, each encoded once.

    ``model.get_image_features`` (Qwen2-VL family: patches of all images concatenated, one
    ``grid_thw`` row per image) runs on the first occurrences only; its per-image
    ``pooler_output`` is then repeated in the batch's order, which is what the model's own
    forward takes as ``mm_encoder_outputs["image"]``. The tower attends within each image
    only, so an image's features do not depend on the others in the batch.
    """
    sizes = grid_thw.prod(-1).tolist()
    bounds = np.cumsum([0, *sizes]).tolist()
    firsts = sorted(set(sources))
    pixels = torch.cat([pixel_values[bounds[i] : bounds[i + 1]] for i in firsts])
    out = model.get_image_features(pixels, grid_thw[firsts], return_dict=True)
    by_first = dict(zip(firsts, out.pooler_output, strict=True))
    out.pooler_output = tuple(by_first[s] for s in sources)
    levels = getattr(out, "deepstack_features", None)  # Qwen3-VL: per image at each level
    if levels is not None:
        out.deepstack_features = [
            tuple(dict(zip(firsts, level, strict=True))[s] for s in sources) for level in levels
        ]
    return out
