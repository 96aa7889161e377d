"""With the encoder cache on, every family that uses it answers exactly as with it off.

float32 on CPU, tiny random models: scores and attention evidence are compared **bit for
bit** (no tolerance) for every family but those of ``WITHIN``: the towers encode each unit
alone, so the cached numbers are the numbers. Where the tower runs all of a call's units as
one sequence (Pixtral's block-diagonal attention over concatenated patches), a call on a
subset rounds differently in the last bits (as batching the same request with others
does, cache or not), so those families are held to 1e-6 instead. Each family runs a batch
cold (every unit a miss), the same batch warm (every unit a hit: the tower does not run),
and a mixed batch (reordered hits beside new images), each against the cache-off answer of
the same batch."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from app.engine.encoder_cache import EncoderCache
from app.engine.runner import RetrievalItem
from app.method import debias
from lad_lab.testing.tiny_models import random_images

CACHED_FAMILIES = (
    "qwen2_5_vl",
    "qwen2_vl",
    "qwen3_vl",
    "qwen3_5",
    "glm4v",
    "gemma3",
    "mistral3",
    "internvl",
    "idefics3",
    "smolvlm",
    "llava",  # the generic adapter, one pixel_values row per image
)
"""Every registered family that names a split, and the generic adapter's simplest family."""
WITHIN = {"mistral3": 1e-6}
"""Families compared within a tolerance (absolute, on log-probabilities and attention)."""
BY_PIXELS = {"internvl", "idefics3", "smolvlm"}
"""Families whose units are tiles: keyed by their pixels (the others by image content)."""


@contextmanager
def cache_on(runner, capacity_mb: float = 64) -> Iterator[EncoderCache]:
    """A fresh cache on a shared runner, its own (off) cache put back afterwards."""
    kept = runner.encoder_cache
    runner.encoder_cache = EncoderCache(capacity_mb, kept.fingerprint)
    try:
        yield runner.encoder_cache
    finally:
        runner.encoder_cache = kept


def assert_same(a, b, atol: float = 0.0) -> None:
    pairs = [*zip(a.scores, b.scores, strict=True), *zip(a.attention, b.attention, strict=True)]
    for s, t in pairs:
        if atol:
            np.testing.assert_allclose(s, t, rtol=0, atol=atol)
        else:
            assert np.array_equal(s, t)


@pytest.mark.parametrize("family", CACHED_FAMILIES)
def test_cache_on_equals_cache_off_cold_warm_and_mixed(shared_runner, family: str) -> None:
    runner = shared_runner(family)
    assert not runner.encoder_cache.enabled  # runners outside the service: off by default
    images = random_images(7, seed=11)
    batch = [RetrievalItem("a cat", images[:3]), RetrievalItem("a dog", images[3:5])]
    mixed = [
        RetrievalItem("a cat", [images[4], images[5], images[0]]),  # two hits around a miss
        RetrievalItem("a dog", [images[6], images[1]]),
    ]
    off, off_mixed = runner.forward(batch), runner.forward(mixed)
    with cache_on(runner) as cache:
        cold = runner.forward(batch)
        units = cache.stats.misses
        assert units >= 5 and cache.stats.hits == 0 and len(cache) == units
        assert (cache.stats.by_pixels > 0) == (family in BY_PIXELS)
        warm = runner.forward(batch)
        assert cache.stats.misses == units and cache.stats.hits == units  # no tower run
        hot = runner.forward(mixed)
        assert cache.stats.misses > units and cache.stats.hits > units  # some of each
    atol = WITHIN.get(family, 0.0)
    assert_same(off, cold, atol)
    assert_same(off, warm, atol)
    assert_same(off_mixed, hot, atol)


def test_perm_avg_orderings_after_the_first_are_all_hits(shared_runner) -> None:
    """The N orderings of one image list, one forward each (as under a busy batcher), and
    all N in one batch (the adapter's own sharing of repeated images meets the cache)."""
    runner = shared_runner("qwen2_5_vl")
    images = random_images(4, seed=3, sizes=[(56, 56), (84, 56), (56, 112), (70, 70)])
    orders = debias.rotations(4)
    items = [RetrievalItem("a red square", [images[p] for p in o]) for o in orders]
    off = [runner.forward([item]) for item in items]
    off_batch = runner.forward(items)
    with cache_on(runner) as cache:
        on = [runner.forward([item]) for item in items]
        assert (cache.stats.misses, cache.stats.hits) == (4, 12)
        on_batch = runner.forward(items)
        assert (cache.stats.misses, cache.stats.hits) == (4, 16)  # 4 distinct images: hits
    for a, b in zip(off, on, strict=True):
        assert_same(a, b)
    assert_same(off_batch, on_batch)


def test_a_family_without_a_split_bypasses_the_cache(shared_runner) -> None:
    """LLaVA-OneVision patches an image only when its prompt has one image: an image's
    features depend on its neighbours' count, so the adapter names no split."""
    runner = shared_runner("llava_onevision")
    assert runner.adapter.encoder_split() is None
    images = random_images(3, seed=4)
    items = [RetrievalItem("a cat", images)]
    off = runner.forward(items)
    with cache_on(runner) as cache:
        on = runner.forward(items)
        assert len(cache) == 0 and cache.stats.hits == cache.stats.misses == 0
    assert_same(off, on)


def test_a_stream_of_unique_images_never_grows_the_cache_past_its_bound(shared_runner) -> None:
    runner = shared_runner("qwen2_5_vl")
    images = random_images(3, seed=1)
    with cache_on(runner, capacity_mb=0) as probe:
        assert not probe.enabled
    with cache_on(runner) as cache:
        runner.forward([RetrievalItem("q", images)])
        unit = cache.bytes // 3  # one 48x48 image's embeddings
    bound_mb = 5.5 * unit / (1024 * 1024)  # room for five units and a half
    with cache_on(runner, capacity_mb=bound_mb) as cache:
        for step in range(12):
            fresh = random_images(3, seed=1000 + step)  # never seen before: a hostile stream
            runner.forward([RetrievalItem("q", fresh)])
            assert cache.bytes <= cache.capacity_bytes and len(cache) <= 5
        assert cache.stats.misses == 36 and cache.stats.hits == 0
        assert cache.stats.evictions == 36 - len(cache) == 31


def test_two_images_never_share_a_key_and_another_preprocessing_misses(shared_runner) -> None:
    """Keys by image content: a copy of an image (another object, the same bytes) hits, an
    image one pixel away misses; the same images under another image-processor setting
    miss, and answer as the cache-off run at that setting does."""
    runner = shared_runner("qwen2_5_vl")
    images = random_images(2, seed=21)
    twin = images[0].copy()
    nudged = images[0].copy()
    nudged.putpixel((0, 0), tuple((v + 1) % 256 for v in nudged.getpixel((0, 0))))
    items = [RetrievalItem("a cat", images)]
    processor = runner.processor.image_processor
    kept = processor.image_mean
    with cache_on(runner) as cache:
        runner.forward(items)
        assert (cache.stats.misses, cache.stats.by_pixels) == (2, 0)  # keyed by content
        runner.forward([RetrievalItem("a cat", [twin, nudged])])
        assert (cache.stats.hits, cache.stats.misses) == (1, 3)  # the twin hits, nudged not
        try:
            processor.image_mean = [0.25, 0.5, 0.75]
            on = runner.forward(items)
            assert (cache.stats.hits, cache.stats.misses) == (1, 5)  # new setting: misses
            assert runner.forward(items).scores[0].tolist() == on.scores[0].tolist()
            assert cache.stats.hits == 3
            runner.encoder_cache = EncoderCache(0, cache.fingerprint)
            off = runner.forward(items)
        finally:
            processor.image_mean = kept
    assert_same(off, on)
    assert not np.array_equal(off.scores[0], runner.forward(items).scores[0])
