"""perm_avg's rotations share their images: each distinct image goes through the processor
and the vision tower once, and the model answers exactly as it would without the sharing."""

from __future__ import annotations

import torch

from app.engine.runner import RetrievalItem
from app.method import debias
from app.models.qwen_inputs import image_sources, install, unique_image_processing
from lad_lab.testing.tiny_models import random_images


def test_rotations_of_shared_images_give_the_same_batch_as_copies(shared_runner) -> None:
    runner = shared_runner("qwen2_5_vl")
    images = random_images(4, seed=5, sizes=[(56, 56), (84, 56), (56, 112), (70, 70)])
    orders = debias.rotations(len(images))
    shared = [RetrievalItem("a red square", [images[p] for p in o]) for o in orders]
    copies = [RetrievalItem("a red square", [images[p].copy() for p in o]) for o in orders]
    a, b = runner.process(shared), runner.process(copies)
    assert set(a.inputs) == set(b.inputs)
    for key, value in a.inputs.items():
        assert torch.equal(value, b.inputs[key]), key
    assert a.extra["image_sources"] == [0, 1, 2, 3, 1, 2, 3, 0, 2, 3, 0, 1, 3, 0, 1, 2]
    assert "image_sources" not in b.extra  # copies are distinct objects: nothing shared
    x, y = runner.forward(shared), runner.forward(copies)
    for s, t in zip(x.scores, y.scores, strict=True):
        assert (s == t).all()  # the model's answers agree row by row
    for s, t in zip(x.attention, y.attention, strict=True):
        assert (s == t).all()  # and so does the attention evidence


def test_the_vision_tower_encodes_each_shared_image_once(shared_runner) -> None:
    runner = shared_runner("qwen2_vl")
    images = random_images(3, seed=2, sizes=[(56, 56), (84, 56), (56, 112)])
    items = [RetrievalItem("a cat", [images[p] for p in o]) for o in debias.rotations(3)]
    tower = runner.model.model.visual
    seen: list[int] = []
    handle = tower.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(len(kwargs["grid_thw"])), with_kwargs=True
    )
    try:
        runner.forward(items)
        runner.forward([RetrievalItem("a cat", [im.copy() for im in images]) for _ in range(3)])
    finally:
        handle.remove()
    assert seen == [3, 9]  # 3 distinct images of 9 once each; 9 copies all encoded


def test_image_sources_name_first_occurrences() -> None:
    a, b = object(), object()
    assert image_sources([a, b, a, a, b]) == [0, 1, 0, 0, 1]
    assert image_sources([a, b]) is None


def test_skipping_the_processor_resize_changes_no_pixel(shared_runner) -> None:
    """Decoded images already have the processor's size, so the adapter turns its resize
    (and RGB conversion) off; the processor's output is the same as with them on."""
    runner = shared_runner("qwen2_5_vl", image_pixels=112)
    adapter = runner.adapter
    images = random_images(3, seed=7, sizes=[(112, 112)] * 3)
    assert adapter.processor_kwargs(images) == {"do_convert_rgb": False, "do_resize": False}
    odd = random_images(1, seed=7, sizes=[(100, 90)])
    assert "do_resize" not in adapter.processor_kwargs(images + odd)  # not at its size
    prompt = runner.prompts([RetrievalItem("a dog", images)], "digits")
    call = {"text": list(prompt), "images": images, "return_tensors": "pt"}
    fast, full = (
        adapter.processor(**call, **adapter.processor_kwargs(images)),
        adapter.processor(**call),
    )
    for key, value in full.items():
        assert torch.equal(value, fast[key]), key


def test_the_image_processor_sees_each_image_once() -> None:
    seen: list[int] = []

    def process(images: list, **kwargs: object) -> tuple[dict, list]:
        seen.append(len(images))
        grid = torch.tensor([[1, 1, im] for im in images])  # image k has k patches
        pixels = torch.cat([torch.full((im, 2), float(im)) for im in images])
        return {"pixel_values": pixels, "image_grid_thw": grid}, [f"<{im}>" for im in images]

    wrapped = unique_image_processing(process)
    one, two, three = 1, 2, 3  # small ints are shared objects: the same image three times
    features, replacements = wrapped([two, three, one, two, three, one])
    assert seen == [3]
    assert replacements == ["<2>", "<3>", "<1>", "<2>", "<3>", "<1>"]
    assert features["image_grid_thw"][:, 2].tolist() == [2, 3, 1, 2, 3, 1]
    assert features["pixel_values"][:, 0].tolist() == [2, 2, 3, 3, 3, 1] * 2
    wrapped([1, 2])  # all distinct: passed through as they are
    assert seen == [3, 2]


def test_install_is_idempotent_and_skips_processors_without_the_hook(shared_runner) -> None:
    class Plain:
        pass

    assert install(Plain()) is False
    runner = shared_runner("qwen2_vl")
    hook = runner.processor._process_images
    assert install(runner.processor) is True and runner.processor._process_images is hook


def test_decode_gives_the_qwen_processor_its_exact_input_size(shared_runner) -> None:
    import io

    from app.service.decode import Decoder
    from app.settings import Settings

    runner = shared_runner("qwen2_5_vl", image_pixels=112)  # 112 x 112 = 16 tokens of 28²
    decoder = Decoder(
        Settings(_env_file=None, store_url="memory://"),
        pixel_budget=runner.image_pixel_budget(),
        image_size=runner.image_size_for,
    )
    raw = io.BytesIO()
    random_images(1, seed=1, sizes=[(1000, 1000)])[0].save(raw, format="JPEG")
    image = decoder.images([raw.getvalue()], "images")[0]
    assert image.size == runner.image_size_for(1000, 1000) == (112, 112)
    grid = runner.process([RetrievalItem("x", [image, image])]).inputs["image_grid_thw"]
    assert grid[0].tolist() == [1, 8, 8]  # the processor kept the decoded size
    # this processor is pinned to min = max pixels: a 1000 x 600 image has no size it keeps
    # (it would resize 140 x 84 up again), so decode falls back to the pixel budget
    assert runner.image_size_for(1000, 600) == (140, 84)
    assert runner.image_size_for(140, 84) != (140, 84)


def test_generation_with_shared_images_equals_copies(shared_runner) -> None:
    """The generation baselines (cot, self-consistency) take the same shared-image path: the
    encoder outputs serve the prompt step, and the decoding steps run without them."""
    from lad_lab.eval.generate import generate_answers

    runner = shared_runner("qwen2_5_vl")
    images = random_images(3, seed=1, sizes=[(56, 56)] * 3)
    orders = debias.rotations(3)
    shared = [RetrievalItem("a cat", [images[p] for p in o]) for o in orders]
    copies = [RetrievalItem("a cat", [images[p].copy() for p in o]) for o in orders]
    a = generate_answers(runner, shared, max_new_tokens=6)
    b = generate_answers(runner, copies, max_new_tokens=6)
    assert [g.texts for g in a] == [g.texts for g in b]
    assert [g.forward_passes for g in a] == [g.forward_passes for g in b]
