"""``--benchmark paper``: COCO items built as the authors' builder builds them, from a tiny
COCO annotation pair written in code. Their procedure is written out again here over file
names (one seeded ``random`` stream: pool, then every Random item, then every Adversarial
one) and the items must be theirs, image for image; Adversarial negatives (tiny CLIP) obey
their rules."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from lad_lab.eval.datasets import InputError, open_dataset
from lad_lab.eval.datasets.clip import clip_embeddings, clip_text_embeddings
from lad_lab.eval.datasets.coco import read_coco
from lad_lab.eval.datasets.coco_paper import AuthorsPool
from tests.unit.eval.fixtures import tiny_clip, write_coco

N = 4


def authors_random_items(names, first_caption, n, count, seed, pool_size):
    """Their Random sequences: (file names in shown order, target index, caption)."""
    rng = random.Random(seed)
    pool = rng.sample(sorted(names), min(pool_size, len(names)))
    out = []
    for _ in range(count):
        anchor = rng.sample(pool, n)[0]
        negatives = rng.sample([p for p in pool if p != anchor], n - 1)
        final = [anchor, *negatives]
        rng.shuffle(final)
        out.append((final, final.index(anchor), first_caption[anchor]))
    return out


@pytest.fixture
def coco(tmp_path: Path):
    captions, images, instances = write_coco(tmp_path / "coco", count=30)
    doc = json.loads(instances.read_text())  # two categories for some images
    doc["annotations"] += [{"image_id": i, "category_id": 2} for i in (1, 4, 7)]
    instances.write_text(json.dumps(doc))
    return captions, images, instances


def test_random_items_are_the_authors_image_for_image(coco) -> None:
    captions, images, instances = coco
    pool = read_coco(captions, images, instances)
    first = {p.path.name: p.captions[0] for p in pool}
    dataset = AuthorsPool("coco", pool, pool_size=20)
    items = dataset.items(12, N, "random", seed=42)
    want = authors_random_items(list(first), first, N, 12, 42, 20)
    got = [([im.name for im in i.images], i.answer, i.query) for i in items]
    assert got == want
    assert {i.answer for i in items} != {0}  # shuffled: the target is not always first
    # one caption per image, the first in the file (image 1 also has "another caption")
    assert "another caption" not in {i.query for i in items}
    assert len({im for i in items for im in i.images}) <= 20  # drawn from the pool only


def test_adversarial_negatives_follow_their_rules(coco, tmp_path) -> None:
    captions, images, instances = coco
    clip, cache = tiny_clip(tmp_path / "clip"), tmp_path / "cache"
    dataset = open_dataset(
        "coco",
        data=captions,
        images=images,
        instances=instances,
        clip=clip,
        cache_dir=cache,
        benchmark="paper",
    )
    assert isinstance(dataset, AuthorsPool)
    pool = dataset.images
    index = {p.path: k for k, p in enumerate(pool)}
    img = clip_embeddings(clip, [p.path for p in pool], cache)
    txt = clip_text_embeddings(clip, [p.captions[0] for p in pool], cache)
    items = dataset.items(8, N, "adversarial", seed=42)
    assert len(items) == 8
    for item in items:
        target = index[item.images[item.answer]]
        negatives = [index[im] for k, im in enumerate(item.images) if k != item.answer]
        allowed = [
            p
            for p in range(len(pool))
            if p != target
            and not pool[target].categories <= pool[p].categories
            and float(txt[target] @ txt[p]) < 0.9
        ]
        best = sorted(allowed, key=lambda p: -float(img[target] @ img[p]))[: N - 1]
        assert sorted(negatives) == sorted(best)  # the nearest allowed, in any shown order


def test_calibration_items_skip_the_evaluated_targets(coco) -> None:
    captions, images, instances = coco
    dataset = AuthorsPool("coco", read_coco(captions, images, instances))
    evaluated = dataset.items(6, N, "random", seed=1)
    keys = frozenset(i.key for i in evaluated)
    calibration = dataset.items(5, N, "random", seed=2, exclude=keys)
    assert len(calibration) == 5 and not {i.key for i in calibration} & keys


def test_the_paper_construction_needs_instances_and_is_the_protocols(coco, tmp_path) -> None:
    from lad_lab.eval import cli

    captions, images, instances = coco
    with pytest.raises(InputError, match="--instances"):
        open_dataset("coco", data=captions, images=images, benchmark="paper")
    out = tmp_path / "out"
    argv = ["--dry-run", "--dataset", "coco", "--data", str(captions), "--images", str(images)]
    argv += ["--instances", str(instances), "--items", "3", "--calibration", "2", "-n", "4"]
    assert cli.main([*argv, "--protocol", "paper", "--out", str(out)]) == 0
    doc = json.loads((out / "protocol.json").read_text())
    assert doc["dataset"]["benchmark"] == "paper"
    assert all("-paper/" in i["id"] for i in doc["runs"][0]["items"])
    assert cli.main([*argv, "--protocol", "paper", "--benchmark", "ours", "--out", str(out)]) == 0
    assert json.loads((out / "protocol.json").read_text())["dataset"]["benchmark"] == "ours"
    items = json.loads((out / "protocol.json").read_text())["runs"][0]["items"]
    assert not any(i["id"].startswith("coco-paper") for i in items)
