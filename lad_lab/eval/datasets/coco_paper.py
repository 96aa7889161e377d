"""The authors' construction of the COCO benchmark (``--benchmark paper``), from COCO's own
annotation files (JSON; the authors ship pickles, read here from nowhere).

What their builder does, redone from its description (brightXian/LAD, data/):

- the images: those with a caption and a category set (captions and instances JSON,
  val2014 in the paper) whose file exists, sorted by file name; one caption each, the
  first of the image in the captions file;
- the pool: ``POOL`` (20,000) of them, drawn with Python's ``random`` seeded once
  (their --seed, 42); every later draw continues that one stream;
- an item: N images drawn from the pool, the first the target; Random negatives are
  N − 1 pool images other than the target, drawn uniformly; Adversarial negatives are the
  N − 1 pool images nearest the target by CLIP image cosine, skipping an image whose
  category set contains the target's and one whose *single* caption has CLIP text cosine
  ≥ 0.9 with the target's; then the N images are shuffled, wherever the target lands;
- all Random items are drawn first, then all Adversarial ones, from the same stream, so
  the Adversarial items depend on the number of items (as theirs do).

Calibration items (theirs: the first M evaluation items; ours: disjoint) are drawn the
same way from the calibration seed, skipping any item whose target is evaluated.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from lad_lab.eval.datasets.base import (
    CAPTION_SIMILARITY,
    EvalItem,
    InputError,
    PoolImage,
    TextEmbed,
    check_setting,
)

POOL = 20_000
"""The authors' --pool_size."""


class AuthorsPool:
    """Items built as the authors' builder builds them (see the module docstring)."""

    settings: tuple[str, ...] = ("random", "adversarial")

    def __init__(
        self,
        name: str,
        images: Sequence[PoolImage],
        image_embed: Callable[[list[Path]], np.ndarray] | None = None,
        text_embed: TextEmbed | None = None,
        pool_size: int = POOL,
    ) -> None:
        usable = sorted((p for p in images if p.categories), key=lambda p: p.path.name)
        if len(usable) < 2:
            raise InputError(
                f"the authors' construction of {name!r} needs images with captions and "
                "categories: pass COCO's --instances file"
            )
        self.name = name
        self.source = name
        self.images = usable
        self.pool_size = pool_size
        self._image_embed = image_embed
        self._text_embed = text_embed
        self._similar: tuple[np.ndarray, np.ndarray] | None = None

    def _pool(self, rng: random.Random) -> list[int]:
        return rng.sample(range(len(self.images)), min(self.pool_size, len(self.images)))

    def _similarities(self) -> tuple[np.ndarray, np.ndarray]:
        """(image cosines, caption cosines) over all images, computed once."""
        if self._image_embed is None or self._text_embed is None:
            raise InputError(f"the adversarial setting of {self.name!r} needs --clip PATH")
        if self._similar is None:
            img = self._image_embed([p.path for p in self.images])
            txt = self._text_embed([p.captions[0] for p in self.images])
            self._similar = (img @ img.T, txt @ txt.T)
        return self._similar

    def _adversarial(self, anchor: int, k: int, pool: list[int]) -> list[int]:
        image_cos, text_cos = self._similarities()
        cats = self.images[anchor].categories or frozenset()
        allowed = [
            p
            for p in pool
            if p != anchor
            and not cats <= (self.images[p].categories or frozenset())
            and text_cos[anchor, p] < CAPTION_SIMILARITY
        ]
        allowed.sort(key=lambda p: image_cos[anchor, p], reverse=True)  # stable, as theirs
        return allowed[:k]

    def sequences(
        self, count: int, n: int, seed: int, upto: str = "adversarial"
    ) -> dict[str, list[tuple[list[int], int]]]:
        """setting -> ``count`` (image indices in shown order, the target's position),
        drawn in the authors' order (every Random item, then every Adversarial one) and up
        to the setting ``upto`` (Random items need no CLIP)."""
        rng = random.Random(seed)
        pool = self._pool(rng)
        out: dict[str, list[tuple[list[int], int]]] = {}
        for setting in self.settings[: self.settings.index(upto) + 1]:
            rows = []
            for _ in range(count):
                anchor = rng.sample(pool, n)[0]
                if setting == "random":
                    negatives = rng.sample([p for p in pool if p != anchor], n - 1)
                else:
                    negatives = self._adversarial(anchor, n - 1, pool)
                if len(negatives) < n - 1:
                    raise InputError(
                        f"{self.source}: target {self.images[anchor].path.name} has only "
                        f"{len(negatives)} allowed negatives for N={n}; use a larger pool"
                    )
                final = [anchor, *negatives]
                rng.shuffle(final)
                rows.append((final, final.index(anchor)))
            out[setting] = rows
        return out

    def _item(self, number: int, row: tuple[list[int], int], seed: int) -> EvalItem:
        shown, answer = row
        target = self.images[shown[answer]]
        return EvalItem(
            f"{self.name}-paper/{seed}/{number}",
            target.captions[0],
            [self.images[p].path for p in shown],
            answer,
            str(target.path),
        )

    def items(
        self, count: int, n: int, setting: str, seed: int, exclude: frozenset[str] = frozenset()
    ) -> list[EvalItem]:
        check_setting(self, setting)
        if setting == "adversarial":
            self._similarities()  # fail before drawing, not after
        extra = 0 if not exclude else len(exclude) + count
        rows = self.sequences(count + extra, n, seed, upto=setting)[setting]
        items = [self._item(i, row, seed) for i, row in enumerate(rows)]
        return [i for i in items if i.key not in exclude][:count]
