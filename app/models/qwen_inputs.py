"""The Qwen2-VL family's image inputs at their cost: the processor's output computed directly,
and each distinct image through the processor and the vision tower once per batch.

The direct output, when decode already made each image's size: transformers' processor call
costs a few milliseconds per request whatever the image size (kwargs merging and validation,
the tokenizer over hundreds of expanded ``<|image_pad|>`` tokens, the modality ids, patchify
through generic image code). When every image is RGB and already at the size the processor
would resize it to (decode resamples straight to it), the same tensors follow from three
steps:

- pixels: the image processor's own ``rescale``, ``normalize`` and ``patchify`` on each
  distinct image (so the values are the processor's, bit for bit), concatenated in order;
  ``image_grid_thw`` is (1, h / patch, w / patch) per image;
- text: the unexpanded prompts through the tokenizer in one call, then each
  ``<|image_pad|>`` id repeated grid / merge² times. Special tokens are split off before
  byte-pair merging, so the ids around them do not depend on how many pads follow;
- padding on the left with the tokenizer's pad id, the attention mask, and the modality
  ids (1 on image tokens, 0 elsewhere).

Any other case (another image processor backend, a resize still needed, a video, a tokenizer
that adds tokens around special tokens) returns None and the processor runs.
``tests/integration/models/test_qwen_inputs.py`` checks equality with the processor.

Repeated images, processed and encoded once however often they appear: a ``perm_avg``
request (and a calibration) runs the N cyclic rotations of one image list as one batch, so
the batch holds every image N times; without this the image processor resizes, rescales,
normalises and patchifies each of them N times, and the vision tower encodes each of them N
times (about half of a small model's forward). Images are the same when they are the same
object (the rotations share the decoded images), so no pixel is compared or hashed.

Valid for processors whose image output is ``pixel_values`` (the patches of all images,
concatenated) with ``image_grid_thw`` (one row per image: its patches = t·h·w), i.e. the
Qwen2-VL family; any other output goes through the processor unchanged.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

_TABLES: weakref.WeakKeyDictionary[Any, tuple[tuple, np.ndarray]] = weakref.WeakKeyDictionary()
"""Each image processor's value table, with the settings it was made for (kept beside the
processor, not on it: an attribute would be written by ``save_pretrained``, which cannot
write an array)."""


def _value_table(image_processor: Any) -> np.ndarray:
    """(C, 256) float32: what the image processor's own ``rescale`` and ``normalize`` make of
    each 8-bit value in each channel. Both are element-wise, so looking a pixel up here
    gives the processor's value for it bit for bit, without a float64 pass over the image."""
    key = (
        image_processor.do_rescale,
        image_processor.rescale_factor,
        image_processor.do_normalize,
        str(image_processor.image_mean),
        str(image_processor.image_std),
    )
    cached = _TABLES.get(image_processor)
    if cached is not None and cached[0] == key:
        return cached[1]
    values = np.broadcast_to(np.arange(256, dtype=np.uint8), (3, 1, 256)).copy()
    if image_processor.do_rescale:
        values = image_processor.rescale(values, image_processor.rescale_factor)
    if image_processor.do_normalize:
        values = image_processor.normalize(
            values, image_processor.image_mean, image_processor.image_std
        )
    table = np.asarray(values, dtype=np.float32)[:, 0, :]
    _TABLES[image_processor] = (key, table)  # settings may change: kept with its key
    return table


def _pixels(
    image_processor: Any, table: np.ndarray, image: Image.Image
) -> tuple[np.ndarray, list[int]]:
    """One RGB image's patches and grid: values from ``table``, the processor's patchify."""
    array = np.moveaxis(np.asarray(image), -1, 0)  # (C, H, W), as the PIL backend reads it
    values = np.stack([table[c].take(array[c]) for c in range(array.shape[0])])
    patches, grid_h, grid_w = image_processor.patchify(
        values,
        patch_size=int(image_processor.patch_size),
        merge_size=int(image_processor.merge_size),
        temporal_patch_size=int(image_processor.temporal_patch_size),
    )
    return patches, [1, grid_h, grid_w]


def applies(processor: Any, images: Sequence[Image.Image], sized: bool) -> bool:
    """Whether the direct computation gives the processor's output for these images:
    the PIL Qwen image processor, RGB images already at its size (``sized``), and a
    fast tokenizer."""
    image_processor = getattr(processor, "image_processor", None)
    tokenizer = getattr(processor, "tokenizer", None)
    return (
        bool(images)
        and sized
        and type(image_processor) is Qwen2VLImageProcessorPil
        and getattr(tokenizer, "is_fast", False)
        and getattr(processor, "image_token_id", None) is not None
        and all(image.mode == "RGB" for image in images)
    )


def _modality_ids(processor: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """1 on image tokens, 2 on video tokens, 0 elsewhere (the processor's own id lists)."""
    types = torch.zeros_like(input_ids)
    for value, ids in ((1, processor.image_token_ids), (2, processor.video_token_ids)):
        known = [int(i) for i in ids if i is not None]
        if known:
            types[torch.isin(input_ids, torch.tensor(known))] = value
    return types


def qwen_inputs(
    processor: Any, prompts: Sequence[str], images: Sequence[Image.Image]
) -> dict[str, torch.Tensor]:
    """The processor's tensors for ``prompts`` (one ``<|image_pad|>`` per image, in order)
    and the flat list ``images`` (each already at the processor's size, RGB), padded left.

    Repeated images (the same object: perm_avg's rotations) are patchified once.
    """
    image_processor, tokenizer = processor.image_processor, processor.tokenizer
    pad_id = int(processor.image_token_id)
    merge = int(image_processor.merge_size) ** 2
    table = _value_table(image_processor)
    done: dict[int, tuple[np.ndarray, list[int]]] = {}
    for image in images:
        if id(image) not in done:
            done[id(image)] = _pixels(image_processor, table, image)
    per_image = [done[id(image)] for image in images]
    counts = np.array([int(np.prod(grid)) // merge for _, grid in per_image], dtype=np.int64)

    rows: list[np.ndarray] = []
    used = 0
    for ids in tokenizer(list(prompts))["input_ids"]:
        row = np.asarray(ids, dtype=np.int64)
        repeats = np.ones_like(row)
        pads = np.flatnonzero(row == pad_id)
        if used + len(pads) > len(counts):
            raise ValueError("more <|image_pad|> tokens in the prompts than images")
        repeats[pads] = counts[used : used + len(pads)]
        used += len(pads)
        rows.append(np.repeat(row, repeats))
    if used != len(counts):
        raise ValueError("fewer <|image_pad|> tokens in the prompts than images")

    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), int(tokenizer.pad_token_id), dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if len(row):
            input_ids[i, width - len(row) :] = torch.from_numpy(row)
            attention_mask[i, width - len(row) :] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "mm_token_type_ids": _modality_ids(processor, input_ids),
        "pixel_values": torch.from_numpy(np.concatenate([p for p, _ in per_image], axis=0)),
        "image_grid_thw": torch.tensor([grid for _, grid in per_image], dtype=torch.long),
    }


# ---------------------------------------------------------------- repeated images
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
