"""perm_avg's rotations share their images: each distinct image is processed once, and the
batch the model sees is exactly the batch it would see without the sharing."""

from __future__ import annotations

import torch

from app.engine import debias
from app.engine.runner import RetrievalItem
from app.models.image_dedup import install, unique_image_processing
from app.testing.tiny_models import random_images, tiny_runner


def test_rotations_of_shared_images_give_the_same_batch_as_copies() -> None:
    runner = tiny_runner("qwen2_5_vl")
    images = random_images(4, seed=5, sizes=[(56, 56), (84, 56), (56, 112), (70, 70)])
    orders = debias.rotations(len(images))
    shared = [RetrievalItem("a red square", [images[p] for p in o]) for o in orders]
    copies = [RetrievalItem("a red square", [images[p].copy() for p in o]) for o in orders]
    a, b = runner.process(shared), runner.process(copies)
    assert set(a.inputs) == set(b.inputs)
    for key, value in a.inputs.items():
        assert torch.equal(value, b.inputs[key]), key
    for x, y in zip(runner.forward(shared).scores, runner.forward(copies).scores, strict=True):
        assert (x == y).all()  # the model's answers agree row by row


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


def test_install_is_idempotent_and_skips_processors_without_the_hook() -> None:
    class Plain:
        pass

    assert install(Plain()) is False
    runner = tiny_runner("qwen2_vl")
    hook = runner.processor._process_images
    assert install(runner.processor) is True and runner.processor._process_images is hook


def test_decode_gives_the_qwen_processor_its_exact_input_size() -> None:
    import io

    from app.decode import Decoder
    from app.settings import Settings

    runner = tiny_runner("qwen2_5_vl", image_pixels=112)  # 112 x 112 = 16 tokens of 28²
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
