"""Dataset readers on tiny fixtures written here: jsonl, COCO, Flickr (both caption formats),
the shared item selection (random / CLIP-nearest negatives, caption and category exclusions),
the overlap check, and the CLIP embedding cache (a tiny random CLIP built in code)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from lad_lab.demo import world
from lad_lab.eval.datasets import check_disjoint, open_dataset
from lad_lab.eval.datasets.base import EvalItem, ImagePool, PoolImage, caption_similarity
from lad_lab.eval.datasets.coco import read_coco
from lad_lab.eval.datasets.flickr import read_flickr
from tests.unit.eval.fixtures import tiny_clip, write_coco, write_jsonl, write_world_images


def test_jsonl_reader(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path)
    ds = open_dataset("jsonl", data=path)
    items = ds.items(20, 4, "given", seed=1)
    assert len(items) == 10  # the 2-image line is skipped at N = 4
    for item in items:
        assert all(Path(p).is_file() for p in item.images)  # relative to the file
        assert item.id.startswith("jsonl/q")
    three = ds.items(5, 3, "given", seed=1)
    assert len(three) == 5 and all(len(i.images) == 3 for i in three)
    row = {r["id"]: r for r in ds.lines}[three[0].id.removeprefix("jsonl/")]
    assert three[0].images[three[0].answer] == row["images"][row["answer"]]
    calib = ds.items(3, 4, "given", seed=2, exclude=frozenset(i.key for i in items[:7]))
    assert not {i.key for i in calib} & {i.key for i in items[:7]}
    with pytest.raises(ValueError, match="no setting"):
        ds.items(2, 4, "random", seed=1)
    (tmp_path / "bad.jsonl").write_text('{"query": "x", "images": ["a.png"], "answer": 3}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1"):
        open_dataset("jsonl", data=tmp_path / "bad.jsonl")


def test_coco_reader_and_random_items(tmp_path: Path) -> None:
    captions, images, instances = write_coco(tmp_path)
    pool = read_coco(captions, images, instances)
    assert len(pool) == 12 and len(pool[0].captions) == 2
    assert pool[0].categories == frozenset({1})
    ds = open_dataset("coco", data=captions, images=images, instances=instances)
    items = ds.items(5, 4, "random", seed=3)
    assert len(items) == 5
    by_path = {p.path: p for p in pool}
    for item in items:
        target = by_path[item.images[item.answer]]
        assert item.query in target.captions and len(set(item.images)) == 4
        for k, path in enumerate(item.images):
            if k != item.answer:  # never a negative of the same category set
                assert by_path[path].categories != target.categories
    assert [i.id for i in items] == [i.id for i in ds.items(5, 4, "random", seed=3)]
    assert [i.id for i in items] != [i.id for i in ds.items(5, 4, "random", seed=4)]
    with pytest.raises(ValueError, match="--clip"):
        ds.items(2, 4, "adversarial", seed=3)


def test_flickr_token_and_csv_formats(tmp_path: Path) -> None:
    images = write_world_images(tmp_path / "flickr", 6)
    token = tmp_path / "Flickr8k.token.txt"
    token.write_text("".join(f"{n}#{k}\t{t} {k}\n" for n, t in images for k in range(2)))
    csv = tmp_path / "captions.txt"
    csv.write_text("image,caption\n" + "".join(f'{n},"{t}, really"\n' for n, t in images))
    for path in (token, csv):
        pool = read_flickr(path, tmp_path / "flickr")
        assert [p.path.name for p in pool] == [n for n, _ in images]
        assert all(p.path.is_file() for p in pool)
    assert read_flickr(token, tmp_path / "flickr")[0].captions == (
        f"{images[0][1]} 0",
        f"{images[0][1]} 1",
    )
    assert read_flickr(csv, tmp_path / "flickr")[0].captions == (f"{images[0][1]}, really",)
    ds = open_dataset("flickr", data=token, images=tmp_path / "flickr")
    assert len(ds.items(3, 3, "random", seed=0)) == 3


def test_adversarial_negatives_are_nearest_neighbours_with_exclusions(tmp_path: Path) -> None:
    paths = [tmp_path / f"{i}.png" for i in range(6)]
    captions = [
        "a red circle",
        "a red circle",
        "a blue star",
        "a green square",
        "a purple cross",
        "a yellow diamond",
    ]
    categories = [{1}, {2}, {1, 2}, {3}, {4}, {1}]  # image 5 has image 0's category set
    pool = [
        PoolImage(p, (c,), frozenset(k))
        for p, c, k in zip(paths, captions, categories, strict=True)
    ]
    angles = np.array([0.0, 0.1, 0.2, 0.3, 1.5, 0.05])  # image 5 is nearest to 0 after image 1
    emb = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    ds = ImagePool("toy", pool, neighbours=lambda: emb)
    item = ds._item(0, 3, "adversarial", seed=0)
    negatives = [p for k, p in enumerate(item.images) if k != item.answer]
    # 1: identical caption, 5: same category set -> skipped; then 2 and 3 are the nearest
    assert sorted(negatives) == [paths[2], paths[3]]
    assert caption_similarity("A red circle.", "a red circle") == 1.0
    assert caption_similarity("a red circle", "a blue star") < 0.9


def test_overlap_is_refused() -> None:
    a = EvalItem("x", "q", [], 0, "key1")
    b = EvalItem("y", "q", [], 0, "key2")
    check_disjoint([a], [b])
    with pytest.raises(ValueError, match="share their target image"):
        check_disjoint([a, b], [EvalItem("z", "other", [], 0, "key2")])


def test_synthetic_items_and_seeds() -> None:
    ds = open_dataset("synthetic", image_size=56)
    items = ds.items(3, 4, "adversarial", seed=3003)
    again = ds.items(3, 4, "adversarial", seed=3003)
    assert [i.key for i in items] == [i.key for i in again]
    other = ds.items(3, 4, "adversarial", seed=2002)
    assert not {i.key for i in items} & {i.key for i in other}
    assert items[0].query == world.make_item(0, 4, "adversarial", 3003).query
    with pytest.raises(ValueError, match="training split"):
        ds.items(1, 4, "random", seed=world.SPLIT_SEEDS["train"])


def test_clip_embeddings_are_cached_as_npy(tmp_path: Path, monkeypatch) -> None:
    from lad_lab.eval.datasets import clip

    model = tiny_clip(tmp_path / "clip")
    paths = []
    for i in range(5):
        paths.append(tmp_path / f"{i}.png")
        Image.new("RGB", (40, 30), (40 * i, 200 - 30 * i, 90)).save(paths[-1])
    emb = clip.clip_embeddings(model, paths, tmp_path / "cache")
    assert emb.shape == (5, 8)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    (cached,) = (tmp_path / "cache").glob("clip_*.npy")
    np.testing.assert_array_equal(np.load(cached, allow_pickle=False), emb)

    def refuse(*_args):
        raise AssertionError("the cache was not used")

    monkeypatch.setattr(clip, "compute_embeddings", refuse)
    np.testing.assert_array_equal(clip.clip_embeddings(model, paths, tmp_path / "cache"), emb)
    with pytest.raises(AssertionError):
        clip.clip_embeddings(model, paths[:4], tmp_path / "cache")  # another image list


def test_paper_rule_text_cosine_and_category_containment(tmp_path: Path) -> None:
    """The authors' adversarial filter: CLIP text cosine >= 0.9 with the query, or a category
    set that contains the target's, is skipped; their random negatives are not filtered."""
    paths = [tmp_path / f"{i}.png" for i in range(6)]
    captions = ["q0", "near query", "far a", "far b", "far c", "far d"]
    categories = [{1}, {2}, {1, 2}, {3}, {1}, {4}]  # 2 and 4 contain the target's {1}
    pool = [
        PoolImage(p, (c,), frozenset(k))
        for p, c, k in zip(paths, captions, categories, strict=True)
    ]
    angles = np.array([0.0, 0.1, 0.2, 0.3, 0.05, 1.5])  # image order: 4, 1, 2, 3, 5
    image_emb = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    text_angle = {
        "q0": 0.0,
        "near query": 0.2,
        "far a": 1.4,
        "far b": 1.5,
        "far c": 1.2,
        "far d": 1.1,
    }  # cos(0.2) = 0.98 >= 0.9: "near query" is too close

    def text_embed(texts: list[str]) -> np.ndarray:
        a = np.array([text_angle[t] for t in texts])
        return np.stack([np.cos(a), np.sin(a)], axis=1)

    ds = ImagePool("toy", pool, neighbours=lambda: image_emb, rule="paper", text_embed=text_embed)
    item = ds._item(0, 3, "adversarial", seed=0)
    negatives = sorted(p for k, p in enumerate(item.images) if k != item.answer)
    assert negatives == [paths[3], paths[5]]  # 4, 2: contain {1}; 1: text cosine 0.98
    ours = ImagePool("toy", pool, neighbours=lambda: image_emb)  # equal sets only, lexical
    item = ours._item(0, 3, "adversarial", seed=0)
    kept = sorted(p for k, p in enumerate(item.images) if k != item.answer)
    assert kept == [paths[1], paths[2]]
    random_item = ds._item(0, 6, "random", seed=0)  # no filter: all five others fit
    assert random_item is not None and len(set(random_item.images)) == 6
    with pytest.raises(ValueError, match="rule"):
        ImagePool("toy", pool, rule="theirs")


def test_clip_text_embeddings_from_a_local_clip(tmp_path: Path) -> None:
    from lad_lab.eval.datasets import clip

    model = tiny_clip(tmp_path / "clip")
    texts = ["a red circle", "a blue star", "a red circle"]
    emb = clip.clip_text_embeddings(model, texts, tmp_path / "cache")
    assert emb.shape == (3, 8)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(emb[0], emb[2], atol=1e-6)
    assert len(list((tmp_path / "cache").glob("clip_*.npy"))) == 1
