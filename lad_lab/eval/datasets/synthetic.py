"""The demo world (``lad_lab.demo.world``) as a dataset: Random and Adversarial items, rendered at
the side the model's processor pins. Item ``i`` of seed ``s`` is ``world.make_item(i, ...)``
with ``seed=s``; the default seeds are the world's "eval" and "calibration" splits, so the
demo model (trained on the "train" split) never saw them."""

from __future__ import annotations

from typing import Any

from lad_lab.demo import world
from lad_lab.eval.datasets.base import EvalItem, check_setting, pixel_key

EVAL_SEED = world.SPLIT_SEEDS["eval"]
CALIBRATION_SEED = world.SPLIT_SEEDS["calibration"]


class SyntheticDataset:
    name = "synthetic"
    settings: tuple[str, ...] = world.SETTINGS

    def __init__(self, image_size: int = world.DEFAULT_IMAGE_SIZE) -> None:
        self.image_size = image_size

    def items(
        self, count: int, n: int, setting: str, seed: int, exclude: frozenset[str] = frozenset()
    ) -> list[EvalItem]:
        check_setting(self, setting)
        if seed == world.SPLIT_SEEDS["train"]:
            raise ValueError(f"seed {seed} is the demo model's training split; use another")
        out: list[EvalItem] = []
        index = 0
        while len(out) < count:
            ex = world.make_item(index, n, setting, seed, self.image_size)
            key = pixel_key(ex.images[ex.target])
            if key not in exclude:
                out.append(
                    EvalItem(f"synthetic/{seed}/{index}", ex.query, list(ex.images), ex.target, key)
                )
            index += 1
        return out


def image_size_for(runner: Any) -> int:
    """The side the model's processor resizes every image to, when it pins one (demo, tiny).

    Qwen-style processors store min/max pixels as ``size.shortest_edge``/``longest_edge``;
    equal values mean a fixed side**2 pixels, so the world renders at exactly that side.
    """
    size = getattr(
        getattr(getattr(runner, "processor", None), "image_processor", None), "size", None
    )
    low = getattr(size, "shortest_edge", None) if size is not None else None
    high = getattr(size, "longest_edge", None) if size is not None else None
    if isinstance(low, int) and low == high and low > 0:
        side = round(low**0.5)
        if side * side == low:
            return side
    return world.DEFAULT_IMAGE_SIZE
