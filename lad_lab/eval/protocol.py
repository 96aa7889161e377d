"""Orderings of the evaluation protocol (DESIGN §2.7) and the position <-> image bookkeeping.

Convention (the same as ``app.method.debias.rotate``): an ordering ``perm`` of N images
shows image ``perm[p]`` at position ``p``, i.e. ``ordered = [images[i] for i in perm]``.
So an image ``i`` sits at position ``inverse(perm)[i]``, and a prediction at position
``p`` chose image ``perm[p]``.

Balanced GT positions: each item gets T = B·N orderings, B random base permutations
(distinct where N! allows) each followed by its N cyclic shifts
``[base[(p + r) % N] for p in range(N)]``, r = 0..N-1. Under the N shifts of one base,
every image (the GT included) visits every position exactly once, so every item is seen
with its GT at every position B times. The draws of item i come from
``SeedSequence([seed, i])`` alone, so adding items never changes the others' orderings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

import numpy as np

DEFAULT_ORDERINGS = 4
DEFAULT_ORDERING_SEED = 0

Item = TypeVar("Item")


def balanced_count(requested: int, n: int) -> int:
    """T rounded up to a multiple of N (at least N): the orderings actually used."""
    if requested < 1 or n < 1:
        raise ValueError(f"need orderings >= 1 and n >= 1, got {requested}, {n}")
    return n * math.ceil(requested / n)


def balanced_orderings(n: int, t: int, *, rng: np.random.Generator) -> np.ndarray:
    """(T, N) int array, T a multiple of N: base permutations, each with its N cyclic shifts."""
    if t % n:
        raise ValueError(f"T = {t} is not a multiple of N = {n}; use balanced_count")
    blocks = t // n
    distinct = min(blocks, math.factorial(n)) if n <= 12 else blocks
    bases: list[tuple[int, ...]] = []
    while len(bases) < distinct:
        base = tuple(int(x) for x in rng.permutation(n))
        if base not in bases:
            bases.append(base)
    while len(bases) < blocks:  # N! < B: repeat the complete set
        bases.append(bases[len(bases) % distinct])
    orderings = [[base[(p + r) % n] for p in range(n)] for base in bases for r in range(n)]
    return np.asarray(orderings, dtype=np.int64)


def item_orderings(n: int, n_items: int, t: int, seed: int = DEFAULT_ORDERING_SEED) -> np.ndarray:
    """(n_items, T, N): the balanced orderings of items 0 .. n_items - 1 (T a multiple of N)."""
    return np.stack(
        [
            balanced_orderings(n, t, rng=np.random.default_rng(np.random.SeedSequence([seed, i])))
            for i in range(n_items)
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
    return np.argmax(perms == tgt[:, None, None], axis=-1)
