"""The Qwen processor's output computed directly (app.models.qwen_inputs) equals the
processor's own, tensor for tensor, wherever the adapter takes that path."""

from __future__ import annotations

import pytest
import torch

from app.engine.runner import RetrievalItem
from app.models import qwen_inputs
from app.models.base import HFAdapter
from app.models.loader import load_runner
from lad_lab.testing.tiny_models import random_images, tiny_runner


def _assert_same(direct: dict, reference: dict) -> None:
    assert set(direct) == set(reference)
    for key, value in reference.items():
        assert direct[key].dtype == value.dtype, key
        assert torch.equal(direct[key], value), key


def _rows(adapter, seed: int) -> list[list]:
    """A row of 2 and a row of 4 images (one image in both: the same object), each already
    at the processor's size, as decode leaves them."""
    raw = random_images(5, seed=seed, sizes=[(112, 112), (200, 90), (64, 160), (300, 300)])
    sized = [im.resize(adapter.image_size_for(*im.size)) for im in raw]
    return [[sized[0], sized[1]], [sized[2], sized[3], sized[4], sized[0]]]


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen2_vl", "qwen3_vl", "qwen3_5"])
@pytest.mark.parametrize("labels", ["digits", "roman"])
def test_direct_inputs_equal_the_processor(family: str, labels: str) -> None:
    runner = tiny_runner(family, image_pixels=112)
    runner.adapter.processor.image_processor.size = {
        "shortest_edge": 56 * 56,
        "longest_edge": 28 * 28 * 40,
    }
    rows = _rows(runner.adapter, seed=3)
    items = [RetrievalItem("a red square", row) for row in rows]
    prompts = runner.prompts(items, labels)
    flat = [image for row in rows for image in row]
    assert len({image.size for image in flat}) > 1  # several sizes, so several token counts
    assert qwen_inputs.applies(runner.processor, flat, sized=True)
    direct = runner.adapter.process(prompts, rows)
    reference = HFAdapter.process(runner.adapter, prompts, rows)  # the processor call
    _assert_same(direct.inputs, reference.inputs)
    assert direct.extra["image_sources"] == [0, 1, 2, 3, 4, 0]
    assert int(direct.attention_mask[0].sum()) < direct.attention_mask.shape[1]  # left-padded


def test_the_processor_still_saves_after_the_direct_path(tmp_path) -> None:
    """The value table the direct path keeps for an image processor is kept beside it: an
    attribute on it would go to ``save_pretrained``, which cannot write an array."""
    runner = tiny_runner("qwen2_5_vl")
    images = random_images(2, seed=5, sizes=[(56, 56)])
    items = [RetrievalItem("a red square", images)]
    assert runner.adapter.image_size_for(56, 56) == (56, 56)  # decode's size: the direct path
    assert qwen_inputs.applies(runner.processor, images, sized=True)
    runner.process(items)
    runner.processor.save_pretrained(tmp_path)
    assert (tmp_path / "processor_config.json").is_file()


def test_direct_inputs_equal_the_processor_on_the_demo_model() -> None:
    """The demo model's word-level tokenizer and its fixed 56 x 56 images (what decode
    makes of any upload), through the runner, as the service calls it."""
    runner = load_runner("demo", device="cpu", dtype="float32")
    images = random_images(4, seed=1, sizes=[(56, 56)])
    items = [RetrievalItem("a small red circle at the top", images)]
    direct = runner.process(items).inputs
    reference = HFAdapter.process(runner.adapter, runner.prompts(items), [images]).inputs
    _assert_same(direct, reference)


def test_images_not_at_the_processor_size_go_through_the_processor(shared_runner) -> None:
    runner = shared_runner("qwen2_5_vl", image_pixels=56)
    images = random_images(2, seed=4, sizes=[(90, 70)])  # the processor must resize these
    adapter = runner.adapter
    assert adapter.image_size_for(90, 70) != (90, 70)
    items = [RetrievalItem("a cat", images)]
    direct = adapter.process(runner.prompts(items), [images])
    reference = HFAdapter.process(adapter, runner.prompts(items), [images])
    _assert_same(direct.inputs, reference.inputs)


def test_a_prompt_with_fewer_image_tokens_than_images_is_refused(shared_runner) -> None:
    runner = shared_runner("qwen2_5_vl")
    images = random_images(2, seed=4, sizes=[(56, 56)])
    prompt = runner.prompts([RetrievalItem("a cat", images[:1])])
    with pytest.raises(ValueError, match="fewer"):
        qwen_inputs.qwen_inputs(runner.processor, prompt, images)
