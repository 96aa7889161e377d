"""The synthetic world of the demo model: determinism, the two settings, distinct images, speed."""

from __future__ import annotations

import numpy as np
import pytest

from lad_lab.demo import world


def _pixels(image) -> bytes:
    return np.asarray(image).tobytes()


def test_caption_words_are_in_the_vocabulary() -> None:
    rng = np.random.default_rng(0)
    vocabulary = set(world.VOCABULARY)
    for _ in range(300):
        assert set(world.caption(world.sample_object(rng)).split()) <= vocabulary
    assert world.caption(world.SceneObject("circle", "red", "small", "top", "striped")) == (
        "a small red circle at the top on a striped background"
    )


def test_captions_identify_the_attributes() -> None:
    """Different attribute combinations never share a caption (the query is unambiguous)."""
    rng = np.random.default_rng(1)
    seen: dict[str, tuple] = {}
    for _ in range(2000):
        obj = world.sample_object(rng)
        key = tuple(obj.attributes.values())
        assert seen.setdefault(world.caption(obj), key) == key


def test_render_is_rgb_of_the_requested_size_and_deterministic() -> None:
    obj = world.sample_object(np.random.default_rng(3))
    for size in (56, 84):
        image = world.render(obj, size)
        assert image.mode == "RGB"
        assert image.size == (size, size)
        assert _pixels(image) == _pixels(world.render(obj, size))


def test_object_colour_is_visible() -> None:
    """The object's colour dominates the pixels that are not background grey."""
    for colour, rgb in world.COLOURS_RGB.items():
        obj = world.SceneObject("square", colour, "large", "center", "plain")
        pixels = np.asarray(world.render(obj, 56)).reshape(-1, 3).astype(int)
        distance = np.abs(pixels - np.array(rgb)).sum(axis=1)
        assert (distance < 30).mean() > 0.05, colour  # a large square covers ~8%


@pytest.mark.parametrize("setting", world.SETTINGS)
@pytest.mark.parametrize("n", [2, 4, 8])
def test_items_are_reproducible_one_by_one(setting: str, n: int) -> None:
    batch = world.make_items(5, n, setting, seed="eval", start=10)
    for k, item in enumerate(batch):
        again = world.make_item(10 + k, n, setting, seed="eval")
        assert item.query == again.query
        assert item.target == again.target
        assert item.attributes == again.attributes
        assert [_pixels(a) for a in item.images] == [_pixels(b) for b in again.images]
        assert len(item.images) == n
        assert item.query == world.caption(item.attributes[item.target])


def test_splits_are_disjoint_streams() -> None:
    def objects(split: str) -> set:
        return {o for it in world.make_items(30, 4, "random", seed=split) for o in it.objects}

    train, calibration, evaluation = objects("train"), objects("calibration"), objects("eval")
    assert not train & calibration
    assert not train & evaluation
    assert not calibration & evaluation


def test_target_is_shared_across_settings_and_n() -> None:
    for i in range(10):
        a = world.make_item(i, 4, "random", "eval")
        b = world.make_item(i, 8, "adversarial", "eval")
        assert a.objects[a.target] == b.objects[b.target]


def test_random_negatives_have_distinct_captions() -> None:
    for item in world.make_items(50, 8, "random", seed="test"):
        captions = [world.caption(a) for a in item.attributes]
        assert len(set(captions)) == len(captions)
        assert captions.count(item.query) == 1


def test_adversarial_negatives_differ_in_exactly_one_attribute() -> None:
    changed: set[str] = set()
    for item in world.make_items(50, 8, "adversarial", seed="test"):
        target = item.attributes[item.target]
        captions = [world.caption(a) for a in item.attributes]
        assert len(set(captions)) == len(captions)
        for j, attributes in enumerate(item.attributes):
            if j != item.target:
                diff = world.attribute_difference(attributes, target)
                assert len(diff) == 1
                changed.update(diff)
    assert changed == set(world.ATTRIBUTE_NAMES)


def test_adversarial_spreads_the_changed_attributes() -> None:
    """With N - 1 <= 5 negatives, each negative changes a different attribute."""
    for item in world.make_items(20, 6, "adversarial", seed="test"):
        target = item.attributes[item.target]
        diffs = [
            world.attribute_difference(a, target)[0]
            for j, a in enumerate(item.attributes)
            if j != item.target
        ]
        assert sorted(diffs) == sorted(world.ATTRIBUTE_NAMES)


def test_adversarial_limit() -> None:
    obj = world.sample_object(np.random.default_rng(0))
    limit = 1 + len(world.one_attribute_neighbours(obj))
    assert len(world.make_item(0, limit, "adversarial").images) == limit
    with pytest.raises(ValueError):
        world.make_item(0, limit + 1, "adversarial")


def test_gt_position_is_uniform() -> None:
    targets = [it.target for it in world.make_items(400, 4, "random", seed="train", image_size=8)]
    counts = np.bincount(targets, minlength=4)
    assert counts.min() > 70  # expected 100 each; 70 is > 6 sigma away


def test_images_are_distinct() -> None:
    for item in world.make_items(20, 8, "adversarial", seed="eval"):
        pixels = [_pixels(image) for image in item.images]
        assert len(set(pixels)) == len(pixels)
    rng = np.random.default_rng(5)
    obj = world.sample_object(rng)
    twin = world.SceneObject(**obj.attributes, jitter=world.sample_object(rng).jitter)
    assert _pixels(world.render(obj)) != _pixels(world.render(twin))


def test_unknown_split_and_setting_are_errors() -> None:
    with pytest.raises(ValueError):
        world.make_item(0, 4, "random", seed="validation")
    with pytest.raises(ValueError):
        world.make_item(0, 4, "nearest")
