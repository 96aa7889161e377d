"""How a family's pixel inputs split into units the vision tower encodes independently.

The encoder cache (``app.engine.encoder_cache``) keys and stores image embeddings per
*unit*: the smallest piece of the pixel input that the vision tower and projector encode
without looking at any other piece (an image for Qwen-style towers, which attend within
each image only; one tile for tiling families, whose tower encodes each tile alone). An
adapter names its family's split (``HFAdapter.encoder_split``); a family whose features
of one image depend on the others in the call (or whose layout is not known) names none,
and its calls bypass the cache.

A split answers two questions about one ``get_image_features`` call: the per-unit slices
of its tensor arguments (``split``; None when this call does not have the expected shape,
so it runs as it is), and the arguments of a call on a subset of units (``join``). What
comes back is split per unit by :func:`unit_features` (the layouts transformers' models
return: ``pooler_output`` as a per-unit sequence or a tensor with one row per unit, and
Qwen3-VL's per-level ``deepstack_features``) and put back together by :func:`assembled`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch

Part = dict[str, torch.Tensor]
"""One unit's slices of the call's per-unit tensor arguments, by argument name."""
Features = tuple[torch.Tensor, ...]
"""One unit's embeddings: its ``pooler_output`` chunk, then one chunk per deepstack level."""


class EncoderSplit(Protocol):
    """A family's answer to "which slices of this call belong to which unit"."""

    name: str
    whole: ClassVar[bool]
    """Whether ``join`` of all a call's units, in order, is the call's own tensor arguments
    (so a call that misses every unit runs as it is)."""

    @property
    def image_pixels(self) -> str | None:
        """The pixel argument whose units are the call's images, one each, in order (the
        cache then keys a unit by its image's content id, not its pixels); None when a unit
        is a piece of an image whose place in it the split does not know (tiles)."""
        ...

    def split(self, arguments: dict[str, Any], n_images: int) -> list[Part] | None:
        """Per-unit slices of ``arguments`` (the call's named arguments), in call order;
        None when the call does not have this split's shape (it then runs uncached)."""
        ...

    def join(self, parts: Sequence[Part]) -> dict[str, torch.Tensor]:
        """The tensor arguments of one call on ``parts`` (a subset of units, in order)."""
        ...

    def unit_output(self, output: Any, count: int) -> tuple[list[Features], Layout] | None:
        """Per-unit features of a call's output over ``count`` units, with its layout; None
        when the output is not per unit."""
        ...

    def assemble(
        self, features: Sequence[Features], layout: Layout, arguments: dict[str, Any]
    ) -> Any:
        """The output the model would return for the call ``arguments``, from its units'
        features in order."""
        ...


class _PerUnitOutput:
    """The output side of most families: one chunk (or stacked row) per unit."""

    def unit_output(self, output: Any, count: int) -> tuple[list[Features], Layout] | None:
        return unit_features(output, count)

    def assemble(
        self, features: Sequence[Features], layout: Layout, arguments: dict[str, Any]
    ) -> Any:
        return assembled(features, layout)


def _cat(parts: Sequence[Part]) -> dict[str, torch.Tensor]:
    return {key: torch.cat([p[key] for p in parts]) for key in parts[0]}


@dataclass(frozen=True)
class GridRows(_PerUnitOutput):
    """Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5, GLM-4V: ``pixel_values`` holds every
    image's patches concatenated, ``image_grid_thw`` one (t, h, w) row per image; image i
    owns t·h·w rows. The tower attends within each image only (its ``cu_seqlens``)."""

    name: str = "grid_rows"
    whole: ClassVar[bool] = True
    pixels: str = "pixel_values"
    grid: str = "image_grid_thw"

    @property
    def image_pixels(self) -> str | None:
        return self.pixels

    def split(self, arguments: dict[str, Any], n_images: int) -> list[Part] | None:
        pixels, grid = arguments.get(self.pixels), arguments.get(self.grid)
        if not isinstance(pixels, torch.Tensor) or not isinstance(grid, torch.Tensor):
            return None
        sizes = [int(s) for s in grid.prod(-1).tolist()]
        if grid.ndim != 2 or sum(sizes) != pixels.shape[0]:
            return None
        parts, start = [], 0
        for i, size in enumerate(sizes):
            parts.append({self.pixels: pixels[start : start + size], self.grid: grid[i : i + 1]})
            start += size
        return parts

    def join(self, parts: Sequence[Part]) -> dict[str, torch.Tensor]:
        return _cat(parts)


@dataclass(frozen=True)
class FirstDim(_PerUnitOutput):
    """LLaVA-style towers (and Gemma 3, Mistral 3, InternVL): unit i is row i of
    ``pixel_values`` and of the other per-unit arguments (e.g. ``image_sizes``).

    ``per_image``: the rows are the batch's images, so a call whose row count is not the
    batch's image count (pan-and-scan crops, tiles) is not split; False when each row is a
    tile encoded on its own (InternVL), whatever the count."""

    name: str = "first_dim"
    whole: ClassVar[bool] = True
    keys: tuple[str, ...] = ("pixel_values", "image_sizes")
    per_image: bool = True

    @property
    def image_pixels(self) -> str | None:
        return self.keys[0] if self.per_image else None

    def split(self, arguments: dict[str, Any], n_images: int) -> list[Part] | None:
        pixels = arguments.get(self.keys[0])
        if not isinstance(pixels, torch.Tensor) or pixels.ndim < 4:
            return None
        count = int(pixels.shape[0])
        if self.per_image and count != n_images:
            return None
        present = {k: arguments[k] for k in self.keys if arguments.get(k) is not None}
        for value in present.values():
            if not isinstance(value, torch.Tensor) or value.shape[0] != count:
                return None
        return [{k: v[i : i + 1] for k, v in present.items()} for i in range(count)]

    def join(self, parts: Sequence[Part]) -> dict[str, torch.Tensor]:
        return _cat(parts)


@dataclass(frozen=True)
class Tiles:
    """Idefics3 and SmolVLM: ``pixel_values`` is (rows, tiles, C, H, W), padded with
    all-zero tiles that the model drops; each real tile is encoded on its own (SigLIP with
    its own ``pixel_attention_mask``, then the pixel-shuffle connector) into the same number
    of feature rows. A unit is one real tile, in the model's own order (row-major); the
    output holds one tensor per prompt row, its real tiles' features concatenated."""

    name: str = "tiles"
    whole: ClassVar[bool] = False  # the call holds padding tiles and one row per prompt
    pixels: str = "pixel_values"
    mask: str = "pixel_attention_mask"

    @property
    def image_pixels(self) -> str | None:
        return None  # a unit is a tile; which image and which tile is not known here

    def split(self, arguments: dict[str, Any], n_images: int) -> list[Part] | None:
        pixels, mask = arguments.get(self.pixels), arguments.get(self.mask)
        if not isinstance(pixels, torch.Tensor) or pixels.ndim != 5:
            return None
        flat = pixels.reshape(-1, *pixels.shape[2:])
        masks = None
        if mask is not None:
            if not isinstance(mask, torch.Tensor) or mask.shape[:2] != pixels.shape[:2]:
                return None
            masks = mask.reshape(-1, *mask.shape[2:])
        parts = []
        for j in torch.nonzero(_real_tiles(pixels).flatten()).flatten().tolist():
            part = {self.pixels: flat[j : j + 1]}
            if masks is not None:
                part[self.mask] = masks[j : j + 1]
            parts.append(part)
        return parts

    def join(self, parts: Sequence[Part]) -> dict[str, torch.Tensor]:
        return {key: value[None] for key, value in _cat(parts).items()}

    def unit_output(self, output: Any, count: int) -> tuple[list[Features], Layout] | None:
        pooled = getattr(output, POOLED, None)  # a call on one row: one tensor of all tiles
        if not isinstance(pooled, (list, tuple)) or len(pooled) != 1:
            return None
        rows = pooled[0]
        if not isinstance(rows, torch.Tensor) or count == 0 or rows.shape[0] % count:
            return None
        chunks = rows.split(rows.shape[0] // count)
        return [(chunk,) for chunk in chunks], Layout(type(output), False, None)

    def assemble(
        self, features: Sequence[Features], layout: Layout, arguments: dict[str, Any]
    ) -> Any:
        counts = _real_tiles(arguments[self.pixels]).sum(-1).tolist()
        rows, start = [], 0
        for count in counts:
            chunk = [f[0] for f in features[start : start + int(count)]]
            rows.append(torch.cat(chunk) if chunk else features[0][0][:0])
            start += int(count)
        return layout.cls(**{POOLED: rows})


def _real_tiles(pixels: torch.Tensor) -> torch.Tensor:
    """(rows, tiles) True where a tile is not padding: the model's own rule (not all zero)."""
    return (pixels != 0).flatten(2).any(-1)


# ---- the output side -------------------------------------------------------------------
POOLED = "pooler_output"
DEEPSTACK = "deepstack_features"
CACHED_FIELDS = frozenset({POOLED, DEEPSTACK})
"""The fields of ``get_image_features``' output that the cache keeps and gives back."""


@dataclass(frozen=True)
class Layout:
    """How one model returns its features: output class, whether ``pooler_output`` (and
    each deepstack level) is a stacked tensor (one row per unit) or a per-unit sequence."""

    cls: type
    stacked: bool
    levels: int | None  # deepstack levels (None: the output has none)


def _per_unit(value: Any, count: int) -> tuple[list[torch.Tensor], bool] | None:
    """``value`` cut into ``count`` chunks, and whether it was one stacked tensor."""
    if isinstance(value, torch.Tensor):
        if value.ndim == 0 or value.shape[0] != count:
            return None
        return [value[i : i + 1] for i in range(count)], True
    sequence = isinstance(value, (list, tuple)) and len(value) == count
    if sequence and all(isinstance(v, torch.Tensor) for v in value):
        return list(value), False
    return None


def unit_features(output: Any, count: int) -> tuple[list[Features], Layout] | None:
    """Per-unit features of a ``get_image_features`` output over ``count`` units, and its
    layout; None when the output is not one of the known per-unit layouts."""
    pooled = _per_unit(getattr(output, POOLED, None), count)
    if pooled is None:
        return None
    chunks, stacked = pooled
    columns: list[list[torch.Tensor]] = [chunks]
    levels = getattr(output, DEEPSTACK, None)
    if levels is not None:
        for level in levels:
            cut = _per_unit(level, count)
            if cut is None or cut[1] != stacked:
                return None
            columns.append(cut[0])
    features = [tuple(column[i] for column in columns) for i in range(count)]
    return features, Layout(type(output), stacked, None if levels is None else len(levels))


def assembled(features: Sequence[Features], layout: Layout) -> Any:
    """An output of ``layout``'s class holding ``features`` in order (what the model's
    forward reads: ``pooler_output`` and, where it has them, the deepstack levels)."""

    def joined(column: int) -> Any:
        chunks = [f[column] for f in features]
        return torch.cat(chunks) if layout.stacked else tuple(chunks)

    fields: dict[str, Any] = {POOLED: joined(0)}
    if layout.levels is not None:
        fields[DEEPSTACK] = [joined(1 + level) for level in range(layout.levels)]
    return layout.cls(**fields)
