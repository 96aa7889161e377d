"""Synthetic world of the demo model: one object per image, a caption per image, retrieval items.

The demo model (DESIGN §4) is trained, calibrated and evaluated on this world, and the
service tests use it too, so everything here is deterministic by seed and cheap enough
to generate on the fly (1000 images of 56 px take well under a second or two).

Attributes (``ATTRIBUTES`` maps each name to its fixed values, in a stable order):

    shape      circle square triangle star diamond cross
    colour     red green blue yellow purple orange
    size       small large
    position   top bottom left right center
    background plain striped dotted checkered      (a grey texture behind the object)

Besides the attributes, every ``SceneObject`` carries a ``jitter`` (dx, dy, scale, angle,
shade; each in [-1, 1]) so that two objects with the same caption give different images.

Captions use a small fixed vocabulary (``VOCABULARY``; every word of every caption)::

    "a small red circle at the top on a striped background"
    "a large blue star in the center on a plain background"

API
---
Single images (stage 1 of training: caption prediction)::

    rng = np.random.default_rng(0)
    obj = sample_object(rng)
    image = render(obj, image_size=56)        # RGB PIL.Image, image_size x image_size
    text = caption(obj)

Retrieval items (N candidates, one matching the query; GT position uniform)::

    items = make_items(200, n_candidates=4, setting="random", seed="eval", image_size=56)
    item = make_item(17, n_candidates=4, setting="adversarial", seed="calibration")
    item.query, item.images, item.target, item.attributes, item.objects

Settings: ``"random"`` draws negatives freely but with captions distinct from the target
and from each other; ``"adversarial"`` draws negatives that differ from the target in
exactly one attribute (the attributes to change are spread round-robin, so for N <= 6 the
N-1 negatives each change a different attribute). At most 1 + 18 candidates exist there.

Seeds: ``seed`` is a split name of ``SPLIT_SEEDS`` ("train", "calibration", "eval",
"test") or an int. Item ``index`` of a split is generated from
``SeedSequence([seed, index, ...])`` alone (``item_rng``), so items are reproducible one
by one and the splits are disjoint streams. The target object of (split, index) is the
same whatever the setting or N, which makes settings comparable item by item. The world is
finite (1440 attribute combinations), so two splits may share a caption, never an image
(the jitter differs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from PIL import Image, ImageDraw

ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "shape": ("circle", "square", "triangle", "star", "diamond", "cross"),
    "colour": ("red", "green", "blue", "yellow", "purple", "orange"),
    "size": ("small", "large"),
    "position": ("top", "bottom", "left", "right", "center"),
    "background": ("plain", "striped", "dotted", "checkered"),
}
ATTRIBUTE_NAMES: tuple[str, ...] = tuple(ATTRIBUTES)
SETTINGS: tuple[str, ...] = ("random", "adversarial")
SPLIT_SEEDS: dict[str, int] = {"train": 1001, "calibration": 2002, "eval": 3003, "test": 4004}
DEFAULT_IMAGE_SIZE = 56

COLOURS_RGB: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 190, 60),
    "blue": (50, 90, 235),
    "yellow": (235, 220, 40),
    "purple": (160, 60, 210),
    "orange": (245, 140, 30),
}
_BACKGROUND_BASE = (48, 48, 48)
_BACKGROUND_PATTERN = (105, 105, 105)
_CENTRES = {
    "top": (0.5, 0.25),
    "bottom": (0.5, 0.75),
    "left": (0.25, 0.5),
    "right": (0.75, 0.5),
    "center": (0.5, 0.5),
}
_RADII = {"small": 0.12, "large": 0.22}  # fraction of the image side
_POSITION_PHRASE = {
    "top": "at the top",
    "bottom": "at the bottom",
    "left": "on the left",
    "right": "on the right",
    "center": "in the center",
}
_SUPERSAMPLE = 3  # draw at 3x and downsample: smooth edges for tiny images


@dataclass(frozen=True)
class SceneObject:
    """One object on its background: the categorical attributes plus a continuous jitter."""

    shape: str
    colour: str
    size: str
    position: str
    background: str
    jitter: tuple[float, float, float, float, float] = (0.0, 0.0, 0.0, 0.0, 0.0)

    @property
    def attributes(self) -> dict[str, str]:
        """The categorical attributes (what the caption says), keyed by ``ATTRIBUTE_NAMES``."""
        return {name: getattr(self, name) for name in ATTRIBUTE_NAMES}


@dataclass(frozen=True)
class RetrievalExample:
    """N candidate images, a caption query and the index of the one that matches it."""

    query: str
    images: list[Image.Image]
    target: int
    attributes: list[dict[str, str]]  # per candidate, in image order
    objects: list[SceneObject]
    setting: str
    index: int


def _vocabulary() -> tuple[str, ...]:
    words = {"a", "on", "background"}
    for values in ATTRIBUTES.values():
        words.update(values)
    for phrase in _POSITION_PHRASE.values():
        words.update(phrase.split())
    return tuple(sorted(words))


VOCABULARY: tuple[str, ...] = _vocabulary()


def caption(obj: SceneObject | Mapping[str, str]) -> str:
    """The caption of an object, e.g. "a small red circle at the top on a striped background"."""
    a = obj.attributes if isinstance(obj, SceneObject) else obj
    return (
        f"a {a['size']} {a['colour']} {a['shape']} {_POSITION_PHRASE[a['position']]}"
        f" on a {a['background']} background"
    )


def _sample_jitter(rng: np.random.Generator) -> tuple[float, float, float, float, float]:
    return tuple(float(x) for x in rng.uniform(-1.0, 1.0, size=5))  # type: ignore[return-value]


def sample_object(rng: np.random.Generator) -> SceneObject:
    """Draw every attribute uniformly and a fresh jitter."""
    values = {name: str(rng.choice(options)) for name, options in ATTRIBUTES.items()}
    return SceneObject(**values, jitter=_sample_jitter(rng))


def _shape_points(shape: str, cx: float, cy: float, r: float, angle: float) -> list[tuple]:
    """Polygon vertices of a shape of circumradius r, rotated by ``angle`` radians."""
    if shape == "square":
        polar = [(r * 0.95, math.pi / 4 + k * math.pi / 2) for k in range(4)]
    elif shape == "diamond":
        polar = [(r * (1.0 if k % 2 == 0 else 0.7), k * math.pi / 2) for k in range(4)]
    elif shape == "triangle":
        polar = [(r, -math.pi / 2 + k * 2 * math.pi / 3) for k in range(3)]
    elif shape == "star":
        polar = [(r if k % 2 == 0 else r * 0.45, -math.pi / 2 + k * math.pi / 5) for k in range(10)]
    elif shape == "cross":
        w = r * 0.36
        pts = [(w, r), (w, w), (r, w), (r, -w), (w, -w), (w, -r)]
        pts += [(-x, -y) for x, y in pts]
        return [
            (
                cx + x * math.cos(angle) - y * math.sin(angle),
                cy + x * math.sin(angle) + y * math.cos(angle),
            )
            for x, y in pts
        ]
    else:
        raise ValueError(f"unknown shape {shape!r}")
    return [
        (cx + rho * math.cos(phi + angle), cy + rho * math.sin(phi + angle)) for rho, phi in polar
    ]


def _draw_background(draw: ImageDraw.ImageDraw, kind: str, side: int) -> None:
    step = max(side // 7, 4)
    if kind == "plain":
        return
    if kind == "striped":
        width = max(step // 3, 1)
        for x in range(-side, side, step):  # diagonal stripes
            draw.line([(x, side), (x + side, 0)], fill=_BACKGROUND_PATTERN, width=width)
    elif kind == "dotted":
        rad = max(step // 6, 1)
        for y in range(step // 2, side, step):
            for x in range(step // 2, side, step):
                draw.ellipse([x - rad, y - rad, x + rad, y + rad], fill=_BACKGROUND_PATTERN)
    elif kind == "checkered":
        for y in range(0, side, step):
            for x in range(0, side, step):
                if (x // step + y // step) % 2 == 0:
                    draw.rectangle([x, y, x + step - 1, y + step - 1], fill=_BACKGROUND_PATTERN)
    else:
        raise ValueError(f"unknown background {kind!r}")


def render(obj: SceneObject, image_size: int = DEFAULT_IMAGE_SIZE) -> Image.Image:
    """Draw ``obj`` as an RGB image of ``image_size`` x ``image_size`` pixels."""
    side = image_size * _SUPERSAMPLE
    image = Image.new("RGB", (side, side), _BACKGROUND_BASE)
    draw = ImageDraw.Draw(image)
    _draw_background(draw, obj.background, side)
    dx, dy, dscale, dangle, dshade = obj.jitter
    fx, fy = _CENTRES[obj.position]
    cx = (fx + 0.05 * dx) * side
    cy = (fy + 0.05 * dy) * side
    r = _RADII[obj.size] * (1.0 + 0.12 * dscale) * side
    shade = 1.0 + 0.12 * dshade
    fill = tuple(int(min(255, max(0, c * shade))) for c in COLOURS_RGB[obj.colour])
    if obj.shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    else:
        angle = math.radians(12.0 * dangle)
        draw.polygon(_shape_points(obj.shape, cx, cy, r, angle), fill=fill)
    return image.resize((image_size, image_size), Image.Resampling.BOX)


def _seed_value(seed: int | str) -> int:
    if isinstance(seed, str):
        if seed not in SPLIT_SEEDS:
            raise ValueError(f"unknown split {seed!r}; expected one of {sorted(SPLIT_SEEDS)}")
        return SPLIT_SEEDS[seed]
    return int(seed)


def item_rng(seed: int | str, index: int, *stream: int) -> np.random.Generator:
    """The RNG of item ``index`` of split ``seed`` (a name of ``SPLIT_SEEDS`` or an int).

    ``stream`` selects an independent sub-stream (e.g. target vs negatives), so one part of
    an item can change (setting, N) without changing the others.
    """
    if index < 0:
        raise ValueError("index must be >= 0")
    return np.random.default_rng(np.random.SeedSequence([_seed_value(seed), index, *stream]))


def one_attribute_neighbours(obj: SceneObject) -> list[tuple[str, str]]:
    """Every (attribute, other value) pair: the objects one attribute away from ``obj``."""
    return [
        (name, value)
        for name, values in ATTRIBUTES.items()
        for value in values
        if value != getattr(obj, name)
    ]


def _random_negatives(target: SceneObject, k: int, rng: np.random.Generator) -> list[SceneObject]:
    seen = {caption(target)}
    negatives: list[SceneObject] = []
    while len(negatives) < k:
        obj = sample_object(rng)
        text = caption(obj)
        if text not in seen:
            seen.add(text)
            negatives.append(obj)
    return negatives


def _adversarial_negatives(
    target: SceneObject, k: int, rng: np.random.Generator
) -> list[SceneObject]:
    """k objects, each differing from ``target`` in exactly one attribute, all distinct."""
    available = {
        name: [v for v in values if v != getattr(target, name)]
        for name, values in ATTRIBUTES.items()
    }
    total = sum(len(v) for v in available.values())
    if k > total:
        raise ValueError(f"adversarial items allow at most {total + 1} candidates, got {k + 1}")
    for values in available.values():
        rng.shuffle(values)
    order = [ATTRIBUTE_NAMES[i] for i in rng.permutation(len(ATTRIBUTE_NAMES))]
    negatives: list[SceneObject] = []
    while len(negatives) < k:
        for name in order:
            if available[name] and len(negatives) < k:
                value = available[name].pop()
                negatives.append(replace(target, **{name: value}, jitter=_sample_jitter(rng)))
    return negatives


def make_item(
    index: int,
    n_candidates: int = 4,
    setting: str = "random",
    seed: int | str = "eval",
    image_size: int = DEFAULT_IMAGE_SIZE,
) -> RetrievalExample:
    """Item ``index`` of split ``seed``: N candidates, the GT position drawn uniformly."""
    if setting not in SETTINGS:
        raise ValueError(f"unknown setting {setting!r}; expected one of {SETTINGS}")
    if n_candidates < 1:
        raise ValueError("n_candidates must be >= 1")
    target = sample_object(item_rng(seed, index, 0))
    rng = item_rng(seed, index, 1, SETTINGS.index(setting), n_candidates)
    make_negatives = _random_negatives if setting == "random" else _adversarial_negatives
    negatives = make_negatives(target, n_candidates - 1, rng)
    gt = int(rng.integers(n_candidates))
    objects = [*negatives[:gt], target, *negatives[gt:]]
    return RetrievalExample(
        query=caption(target),
        images=[render(o, image_size) for o in objects],
        target=gt,
        attributes=[o.attributes for o in objects],
        objects=objects,
        setting=setting,
        index=index,
    )


def make_items(
    n_items: int,
    n_candidates: int = 4,
    setting: str = "random",
    seed: int | str = "eval",
    image_size: int = DEFAULT_IMAGE_SIZE,
    start: int = 0,
) -> list[RetrievalExample]:
    """Items ``start .. start + n_items - 1`` of split ``seed`` (see ``make_item``)."""
    return [
        make_item(i, n_candidates, setting, seed, image_size) for i in range(start, start + n_items)
    ]


def attribute_difference(
    a: SceneObject | Mapping[str, str], b: SceneObject | Mapping[str, str]
) -> list[str]:
    """Names of the attributes in which ``a`` and ``b`` differ."""
    da = a.attributes if isinstance(a, SceneObject) else a
    db = b.attributes if isinstance(b, SceneObject) else b
    return [name for name in ATTRIBUTE_NAMES if da[name] != db[name]]


__all__: Sequence[str] = (
    "ATTRIBUTES",
    "ATTRIBUTE_NAMES",
    "DEFAULT_IMAGE_SIZE",
    "SETTINGS",
    "SPLIT_SEEDS",
    "VOCABULARY",
    "RetrievalExample",
    "SceneObject",
    "attribute_difference",
    "caption",
    "item_rng",
    "make_item",
    "make_items",
    "one_attribute_neighbours",
    "render",
    "sample_object",
)
