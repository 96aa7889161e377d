"""Orderings of the evaluation protocol (DESIGN §2.7) and the position <-> image bookkeeping.

Convention (the same as ``app.engine.debias.rotate``): an ordering ``perm`` of N images
shows image ``perm[p]`` at position ``p``, i.e. ``ordered = [images[i] for i in perm]``.
So an image ``i`` sits at position ``inverse(perm)[i]``, and a prediction at position
``p`` chose image ``perm[p]``.

Each item gets its own T orderings: the identity first, then T-1 distinct non-identity
random permutations drawn from ``SeedSequence([seed, item_index])``, so adding items
never changes the orderings of the others. Where fewer than T distinct permutations exist
(N! < T, e.g. N = 2), all N! are used and then repeated in the same order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

import numpy as np

T_ORDERINGS = 5  # the paper's T: identity + 4 random permutations
DEFAULT_SEED = 0

Item = TypeVar("Item")


def make_orderings(n: int, t: int = T_ORDERINGS, *, rng: np.random.Generator) -> np.ndarray:
    """(T, N) int array: the identity, then T-1 distinct random permutations of 0..N-1."""
    if n < 1 or t < 1:
        raise ValueError(f"need n >= 1 and t >= 1, got n={n}, t={t}")
    identity = tuple(range(n))
    chosen: list[tuple[int, ...]] = [identity]
    distinct = min(t, math.factorial(n)) if n <= 12 else t
    seen = {identity}
    while len(chosen) < distinct:
        perm = tuple(int(x) for x in rng.permutation(n))
        if perm not in seen:
            seen.add(perm)
            chosen.append(perm)
    while len(chosen) < t:  # N! < T: repeat the complete set
        chosen.append(chosen[len(chosen) % distinct])
    return np.asarray(chosen, dtype=np.int64)


def item_orderings(
    n: int, n_items: int, t: int = T_ORDERINGS, seed: int = DEFAULT_SEED, start: int = 0
) -> np.ndarray:
    """(n_items, T, N): the T orderings of items ``start .. start + n_items - 1``."""
    return np.stack(
        [
            make_orderings(n, t, rng=np.random.default_rng(np.random.SeedSequence([seed, i])))
            for i in range(start, start + n_items)
        ]
    ).reshape(n_items, t, n)


def apply_ordering(images: Sequence[Item], perm: Sequence[int]) -> list[Item]:
    """The candidates as shown under ``perm``: position p holds ``images[perm[p]]``."""
    if sorted(int(p) for p in perm) != list(range(len(images))):
        raise ValueError(f"ordering {list(perm)} is not a permutation of 0..{len(images) - 1}")
    return [images[int(p)] for p in perm]


def _check_orderings(orderings: np.ndarray) -> np.ndarray:
    perms = np.asarray(orderings)
    if perms.ndim < 1 or perms.dtype.kind not in "iu":
        raise ValueError(f"orderings must be an integer array (..., N), got {perms.dtype}")
    n = perms.shape[-1]
    if np.any(np.sort(perms, axis=-1) != np.arange(n)):
        raise ValueError(f"every ordering must be a permutation of 0..{n - 1}")
    return perms


def gt_positions(targets: Sequence[int] | np.ndarray, orderings: np.ndarray) -> np.ndarray:
    """(I, T): where each item's GT image sits under each of its orderings.

    targets: (I,) the GT image index in the item's original order; orderings: (I, T, N).
    """
    perms = _check_orderings(orderings)
    tgt = np.asarray(targets, dtype=np.int64)
    if perms.ndim != 3 or tgt.shape != perms.shape[:1]:
        raise ValueError(
            f"need targets (I,) and orderings (I, T, N), got {tgt.shape}, {perms.shape}"
        )
    # position p with perms[i, t, p] == targets[i]
    return np.argmax(perms == tgt[:, None, None], axis=-1)


def chosen_images(predicted_positions: np.ndarray, orderings: np.ndarray) -> np.ndarray:
    """(I, T): the image (original index) chosen by each prediction: ``perm[predicted]``."""
    perms = _check_orderings(orderings)
    pred = np.asarray(predicted_positions, dtype=np.int64)
    if pred.shape != perms.shape[:-1]:
        raise ValueError(f"predictions {pred.shape} do not match orderings {perms.shape}")
    n = perms.shape[-1]
    if np.any(pred < 0) or np.any(pred >= n):
        raise ValueError(f"predicted positions must lie in 0..{n - 1}")
    return np.take_along_axis(perms, pred[..., None], axis=-1)[..., 0]
