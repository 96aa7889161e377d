"""InternVL's multi-image tile cap: min(max_patches, 28 // N) tiles per image keeps a
default-settings request of LAD_MAX_IMAGES images inside a released checkpoint's context,
and rows of different N in one batch equal the rows alone."""

from __future__ import annotations

import numpy as np
import torch
from transformers import GotOcr2ImageProcessorPil

from app.engine.interface import RetrievalItem
from app.models.internvl import InternVLAdapter, InternVLProcessorNoVideo
from app.models.loader import make_runner
from app.settings import Settings
from lad_lab.testing.families.internvl import CHAT_TEMPLATE, build, build_processor
from lad_lab.testing.tiny_models import random_images

torch.set_num_threads(1)


def _processor(tile: int, seq_length: int) -> InternVLProcessorNoVideo:
    """The tiny processor with the released tiling: crop to tiles, 1..12 of them."""
    tokenizer = build_processor().tokenizer
    image_processor = GotOcr2ImageProcessorPil(
        size={"height": tile, "width": tile}, crop_to_patches=True, min_patches=1, max_patches=12
    )
    return InternVLProcessorNoVideo(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_length=seq_length,
        chat_template=CHAT_TEMPLATE,
    )


def test_default_request_of_max_images_fits_a_released_context() -> None:
    # InternVL3-8B-hf: 448 x 448 tiles of 256 tokens, up to 12 per image, a 32k context
    model, _ = build(max_position_embeddings=32768)
    adapter = InternVLAdapter(model, _processor(448, 256))
    assert [adapter.tile_cap(n) for n in (1, 2, 3, 5, 12, 29)] == [12, 12, 9, 5, 2, 1]
    n = Settings(_env_file=None).max_images
    images = random_images(n, seed=1, sizes=[(640, 480), (480, 640), (500, 375)])
    batch = adapter.process([adapter.render(n, "Which image shows a dog?")], [images])
    tokens = int(batch.attention_mask.sum())
    assert tokens <= adapter.context_length() == 32768
    assert batch.inputs["pixel_values"].shape[0] <= n * (2 + 1)  # <= 2 tiles + a thumbnail each
    # the checkpoint's own 12 tiles per image would not fit
    image_processor = adapter.processor.image_processor
    uncapped = sum(
        image_processor.get_number_of_image_patches(img.height, img.width, {"max_patches": 12})
        for img in images
    )
    assert uncapped * 256 > 32768


def test_rows_of_different_n_in_one_batch_equal_the_rows_alone() -> None:
    model, _ = build(seed=2)
    runner = make_runner(model, _processor(32, 16), model_id="tiny-internvl-tiles")
    images = random_images(8, seed=4, sizes=[(64, 48), (40, 90), (96, 96)])
    items = [RetrievalItem("a red boat", images[:3]), RetrievalItem("snow", images[3:8])]
    caps = [runner.adapter.tile_cap(len(item.images)) for item in items]
    assert caps == [9, 5]
    batch = runner.process(items)
    assert batch.inputs["pixel_values"].shape[0] == sum(
        runner.process([item]).inputs["pixel_values"].shape[0] for item in items
    )
    together = runner.forward(items)
    for k, item in enumerate(items):
        alone = runner.forward([item])
        np.testing.assert_allclose(together.scores[k], alone.scores[0], atol=1e-5, rtol=0)
        np.testing.assert_allclose(together.attention[k], alone.attention[0], atol=1e-5, rtol=0)
