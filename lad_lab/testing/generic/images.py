"""Smaller images for the generic tiny builds (``lad_lab.testing.generic.build``): the run time
of the model matrix is in the vision towers and in the image tokens they hand the decoder.

Nothing here knows a family; each rule reads the config's or the processor's own fields:

- a tower that sees every image at one fixed size (its ``image_size``, to which the image
  processor resizes: ``size`` of a height and width, or a shortest edge only) gets a patch
  grid of about :data:`GRID` patches a side instead of 24 or 32, its image size cut by a
  whole factor of the grid; the settings laid out in units of that size follow by the same
  factor (``image_grid_pinpoints``, a fixed count of tokens per image such as
  ``image_seq_length`` or ``num_image_tokens``, a count of the grid's patches such as
  ``num_position_embeddings``), so the processor's token counts and the
  tower agree as they do at the default size;
- an image processor's budget of tokens or pixels per image (``max_soft_tokens``,
  ``max_image_tokens``, ``scale_resolution``) is halved while one probe image still runs
  through the processor and the model (a processor accepting only some values stops at
  the smallest it accepts);
- a linear-attention layer's heads (``linear_num_key_heads``, ``linear_num_value_heads``)
  are cut to the tiny head count, their ratio kept;
- a convolutional autoencoder a model carries for image generation (a config with
  ``base_channels``: Janus's VQ-VAE, unused by a forward pass of text and images) gets
  :data:`CHANNELS` base channels and a codebook of :data:`CODEBOOK` entries.

A build whose smaller images do not run through its model (one probe image) is built again
at the default size (``lad_lab.testing.generic.build.build``).
"""

from __future__ import annotations

import re
from typing import Any

import torch
from transformers import PretrainedConfig

from lad_lab.testing.generic.shrink import config_tree
from lad_lab.testing.tiny_base import random_images

GRID = 8
"""Least side of a shrunk tower's patch grid (in patches)."""
CHANNELS, CODEBOOK = 32, 64
_TOKEN_COUNTS = ("image_seq_length", "num_image_tokens", "mm_tokens_per_image")
_PATCH_COUNTS = ("num_position_embeddings", "num_positions", "num_patches")
_BUDGETS = re.compile(r"^(max_\w*tokens|\w*resolution)$")
_LEAST_BUDGET = {"tokens": 128, "resolution": 112}


def _side(value: Any) -> int | None:
    """An int size, or the common side of a square (h, w) one."""
    if isinstance(value, (list, tuple)) and len(value) == 2 and value[0] == value[1]:
        value = value[0]
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def fixed_size(image_processor: Any) -> bool:
    """Whether the image processor resizes every image to one size (which
    ``_sync_image_size`` sets to the tower's ``image_size``)."""
    size = getattr(image_processor, "size", None)
    if size is None:
        return False
    keys = {k for k in ("height", "width", "shortest_edge", "longest_edge") if size.get(k)}
    return keys in ({"height", "width"}, {"shortest_edge"})


def _factor(grid: int) -> int:
    """The largest whole factor cutting ``grid`` to no less than GRID, its parity kept."""
    for factor in range(grid // GRID, 1, -1):
        if grid % factor == 0 and (grid // factor) % 2 == grid % 2:
            return factor
    return 1


def smaller_images(config: PretrainedConfig) -> int:
    """Cut the fixed image size of ``config``'s tower (module docstring), in place; the
    factor it was cut by (1: unchanged)."""
    factor = 1
    for sub in config_tree(config):
        side, patch = (
            _side(getattr(sub, "image_size", None)),
            _side(getattr(sub, "patch_size", None)),
        )
        if side is None or patch is None or side % patch:
            continue
        factor = factor if factor > 1 else _factor(side // patch)
        if factor == 1 or (side // patch) % factor:
            continue
        value = sub.image_size
        new = side // factor
        sub.image_size = type(value)([new, new]) if isinstance(value, (list, tuple)) else new
        grid = side // patch
        for key in _PATCH_COUNTS:  # derived from the size when the config was made
            count = getattr(sub, key, None)
            if isinstance(count, int) and count - grid**2 in (0, 1):
                setattr(sub, key, (grid // factor) ** 2 + count - grid**2)
    if factor == 1:
        return 1
    for sub in config_tree(config):
        pinpoints = getattr(sub, "image_grid_pinpoints", None)
        if isinstance(pinpoints, list) and all(
            isinstance(p, (list, tuple)) and all(isinstance(v, int) and v % factor == 0 for v in p)
            for p in pinpoints
        ):
            sub.image_grid_pinpoints = [[v // factor for v in p] for p in pinpoints]
        for key in _TOKEN_COUNTS:
            count = getattr(sub, key, None)
            if isinstance(count, int) and not isinstance(count, bool) and count % factor**2 == 0:
                setattr(sub, key, count // factor**2)
    return factor


def follow_pinpoints(image_processor: Any, config: PretrainedConfig) -> None:
    """The image processor's ``image_grid_pinpoints`` are the config's (a checkpoint saves
    them agreeing)."""
    if getattr(image_processor, "image_grid_pinpoints", None) is None:
        return
    for sub in config_tree(config):
        pinpoints = getattr(sub, "image_grid_pinpoints", None)
        if isinstance(pinpoints, list) and pinpoints:
            image_processor.image_grid_pinpoints = [list(p) for p in pinpoints]
            return


def smaller_autoencoder(config: PretrainedConfig) -> None:
    """A generation autoencoder's channels and codebook made tiny (module docstring)."""
    for sub in config_tree(config):
        if not isinstance(getattr(sub, "base_channels", None), int):
            continue
        sub.base_channels = min(sub.base_channels, CHANNELS)
        for key in ("latent_channels",):
            if isinstance(getattr(sub, key, None), int):
                setattr(sub, key, min(getattr(sub, key), CHANNELS))
        for key in ("num_embeddings", "codebook_size"):
            if isinstance(getattr(sub, key, None), int):
                setattr(sub, key, min(getattr(sub, key), CODEBOOK))


def probe(placeholder: str) -> tuple[str, list[Any]]:
    """A prompt of two images of the matrix's sizes (a wide one and a tall one)."""
    return placeholder * 2, random_images(2, seed=98, sizes=[(128, 80), (56, 112)])


def fewer_linear_heads(config: PretrainedConfig, heads: int) -> None:
    """A linear-attention layer's key heads cut to ``heads`` and its value heads in the same
    ratio to them (``linear_num_key_heads`` 16 and ``linear_num_value_heads`` 32 become 2
    and 4): the reference recurrence of those layers runs head by head."""
    for sub in config_tree(config):
        keys, values = (
            getattr(sub, "linear_num_key_heads", None),
            getattr(sub, "linear_num_value_heads", None),
        )
        if not isinstance(keys, int) or keys <= heads:
            continue
        ratio = values // keys if isinstance(values, int) and values % keys == 0 else None
        sub.linear_num_key_heads = heads
        if ratio is not None:
            sub.linear_num_value_heads = heads * ratio


def runs(model: Any, processor: Any, text: str, images: list[Any]) -> bool:
    """Whether ``images`` and ``text`` run through the processor and the model."""
    try:
        inputs = processor(text=[text], images=images, return_tensors="pt")
        with torch.no_grad():
            model(**{k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)})
    except Exception:  # this setting does not fit: the caller keeps the last that did
        return False
    return True


def smaller_budgets(model: Any, processor: Any, text: str, images: list[Any]) -> None:
    """Halve the image processor's per-image budgets while the probe runs (module
    docstring); a ``min_`` twin of a budget is kept at or below it."""
    image_processor = processor.image_processor
    for key, value in list(vars(image_processor).items()):
        if not _BUDGETS.match(key) or isinstance(value, bool) or not isinstance(value, int):
            continue
        least = _LEAST_BUDGET["tokens" if key.endswith("tokens") else "resolution"]
        twin = "min_" + key.removeprefix("max_")
        low = getattr(image_processor, twin, None) if key.startswith("max_") else None
        while value // 2 >= least:
            setattr(image_processor, key, value // 2)
            if isinstance(low, int) and low > value // 2:
                setattr(image_processor, twin, value // 2)
            if not runs(model, processor, text, images):
                setattr(image_processor, key, value)
                if isinstance(low, int):
                    setattr(image_processor, twin, min(low, value))
                break
            value //= 2
