"""What every dataset reader produces, and the item selection shared by the image datasets.

An ``EvalItem`` is one retrieval problem in the item's original candidate order: a query,
N candidate images (PIL images or file paths, opened lazily) and the index of the match.
``key`` names the matching image (a path, or a hash of its pixels) so that the harness can
check that calibration items never overlap evaluation items.

``ImagePool`` is the shared core of the captioned-image datasets (COCO, Flickr): a pool of
images with their captions (and COCO category sets); an item takes one image as the target,
one of its captions as the query and N − 1 other images as negatives, drawn uniformly
("random") or as the target's nearest neighbours by CLIP image embedding ("adversarial").
Two rules exclude negatives (``NEGATIVE_RULES``). "ours": in both settings, never an image
with a caption lexically near-identical to the query (difflib ratio >= 0.9) or (COCO) with
the target's exact category set. "paper" (the authors' builder): random negatives are not
filtered; adversarial ones skip an image whose CLIP *text* embedding of a caption has
cosine >= 0.9 with the query's, or (COCO) whose category set contains the target's.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from PIL import Image

ImageRef = Image.Image | Path
CAPTION_SIMILARITY = 0.9
"""Negatives whose caption is at least this similar to the query are never drawn (§2.7)."""
NEGATIVE_RULES: tuple[str, ...] = ("ours", "paper")
TextEmbed = Callable[[list[str]], np.ndarray]
"""Captions -> L2-normalised CLIP text embeddings (rows in the captions' order)."""


class InputError(ValueError):
    """A mistake in the user's files or flags: the message is one line naming the file, the
    item and what to change (``lad eval`` prints it instead of a traceback)."""


def read_text(path: Path, what: str) -> str:
    """The text of an input file, or an InputError naming it."""
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file (the {what}); check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read the {what} ({exc})") from None


def read_json(path: Path, what: str) -> Any:
    """An input JSON file, or an InputError naming it and where it stops being JSON."""
    try:
        return json.loads(read_text(path, what))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not JSON ({exc}); the {what} must be a JSON file") from None


def check_images(items: Sequence[EvalItem], source: str) -> None:
    """Every candidate file of ``items`` exists, before any forward (else one line)."""
    for item in items:
        for image in item.images:
            if isinstance(image, Path) and not image.is_file():
                raise InputError(
                    f"{source}: item {item.id}: image file {image} not found; fix the path "
                    "(or the image folder) or remove the item"
                )


@dataclass(frozen=True)
class EvalItem:
    """One retrieval problem: ``images[answer]`` matches ``query``."""

    id: str
    query: str
    images: list[ImageRef]
    answer: int
    key: str


class Dataset(Protocol):
    """A reader: ``items`` draws ``count`` items of N candidates from ``seed``, skipping any
    whose key is in ``exclude`` (the evaluation items, when drawing calibration items)."""

    name: str
    settings: tuple[str, ...]

    def items(
        self, count: int, n: int, setting: str, seed: int, exclude: frozenset[str] = frozenset()
    ) -> list[EvalItem]: ...


def open_image(image: ImageRef) -> Image.Image:
    """The RGB PIL image of a reference (a path is read now, not at load time)."""
    if isinstance(image, Image.Image):
        return image.convert("RGB") if image.mode != "RGB" else image
    with Image.open(image) as im:
        return im.convert("RGB")


def pixel_key(image: Image.Image) -> str:
    """Identity of an in-memory image: a hash of its size and pixels."""
    digest = hashlib.sha1(f"{image.size}{image.mode}".encode())
    digest.update(image.tobytes())
    return digest.hexdigest()


def check_disjoint(evaluation: Sequence[EvalItem], calibration: Sequence[EvalItem]) -> None:
    """Calibration items never overlap evaluation items: no shared target image (by key)."""
    shared = {i.key for i in evaluation} & {i.key for i in calibration}
    if shared:
        raise InputError(
            f"{len(shared)} calibration item(s) share their target image with evaluation items; "
            "use another --calibration-seed or more data"
        )


def check_setting(dataset: Dataset, setting: str) -> None:
    if setting not in dataset.settings:
        raise InputError(
            f"dataset {dataset.name!r} has no setting {setting!r}; use one of {dataset.settings}"
        )


def _normal(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def caption_similarity(a: str, b: str) -> float:
    """Lexical similarity in [0, 1] of two captions (difflib ratio of normalised words)."""
    return difflib.SequenceMatcher(None, _normal(a), _normal(b)).ratio()


@dataclass(frozen=True)
class PoolImage:
    path: Path
    captions: tuple[str, ...]
    categories: frozenset[int] | None = None


class ImagePool:
    """Items from a pool of captioned images (see the module docstring)."""

    settings: tuple[str, ...] = ("random", "adversarial")

    def __init__(
        self,
        name: str,
        images: Sequence[PoolImage],
        neighbours: Callable[[], np.ndarray] | None = None,
        *,
        rule: str = "ours",
        text_embed: TextEmbed | None = None,
    ) -> None:
        if len(images) < 2:
            raise InputError(f"dataset {name!r} needs at least 2 captioned images")
        if rule not in NEGATIVE_RULES:
            raise ValueError(f"unknown negative rule {rule!r}; use one of {NEGATIVE_RULES}")
        self.name = name
        self.source = name  # the annotation file, for messages (set by the readers)
        self.pool = list(images)
        self._neighbours = neighbours
        self._order: np.ndarray | None = None
        self.rule = rule
        self._text_embed = text_embed
        self._text: dict[str, np.ndarray] | None = None

    def _text_cosine(self, query: str, candidate: PoolImage) -> float:
        """Largest CLIP text cosine of the query with one of the candidate's captions."""
        if self._text_embed is None:
            raise InputError(f"the paper's adversarial negatives of {self.name!r} need --clip")
        if self._text is None:  # every caption of the pool, embedded once
            texts = list(dict.fromkeys(c for p in self.pool for c in p.captions))
            self._text = dict(zip(texts, self._text_embed(texts), strict=True))
        q = self._text[query]
        return max(float(q @ self._text[c]) for c in candidate.captions)

    def _similar(self, query: str, candidate: PoolImage) -> bool:
        return any(caption_similarity(query, c) >= CAPTION_SIMILARITY for c in candidate.captions)

    def _allowed(self, target: PoolImage, query: str, candidate: PoolImage, setting: str) -> bool:
        if candidate is target:
            return False
        if self.rule == "paper":
            if setting == "random":
                return True
            if target.categories is not None and target.categories <= (
                candidate.categories or frozenset()
            ):
                return False
            return self._text_cosine(query, candidate) < CAPTION_SIMILARITY
        if self._similar(query, candidate):
            return False
        return target.categories is None or candidate.categories != target.categories

    def _ranked(self, index: int, setting: str, rng: np.random.Generator) -> Iterable[int]:
        """Candidate negatives in the order they are tried."""
        if setting == "random":
            return (int(i) for i in rng.permutation(len(self.pool)))
        if self._neighbours is None:
            raise InputError(f"the adversarial setting of {self.name!r} needs --clip PATH")
        if self._order is None:
            emb = self._neighbours()
            self._order = np.argsort(-(emb @ emb.T), axis=1, kind="stable")
        return (int(i) for i in self._order[index])

    def _item(self, index: int, n: int, setting: str, seed: int) -> EvalItem | None:
        rng = np.random.default_rng(np.random.SeedSequence([seed, index]))
        target = self.pool[index]
        query = target.captions[int(rng.integers(len(target.captions)))]
        negatives: list[PoolImage] = []
        for j in self._ranked(index, setting, rng):
            if len(negatives) == n - 1:
                break
            if self.pool[j] not in negatives and self._allowed(
                target, query, self.pool[j], setting
            ):
                negatives.append(self.pool[j])
        if len(negatives) < n - 1:
            return None
        answer = int(rng.integers(n))
        images = [p.path for p in negatives[:answer]] + [target.path]
        images += [p.path for p in negatives[answer:]]
        return EvalItem(f"{self.name}/{target.path.name}", query, images, answer, str(target.path))

    def items(
        self, count: int, n: int, setting: str, seed: int, exclude: frozenset[str] = frozenset()
    ) -> list[EvalItem]:
        check_setting(self, setting)
        out: list[EvalItem] = []
        for index in np.random.default_rng(seed).permutation(len(self.pool)):
            if len(out) == count:
                break
            if str(self.pool[index].path) in exclude:
                continue
            item = self._item(int(index), n, setting, seed)
            if item is not None:
                out.append(item)
        return out
