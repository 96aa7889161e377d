"""The two protocols' settings (design §2.11): the paper's values, its orderings and prompts."""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.labels import cot_prompt_text
from lad_lab.eval.paper import (
    OURS,
    PAPER,
    PERM_AVG_STREAM,
    paper_layers,
    random_orders,
    shared_orderings,
    spec,
    tile_cap,
)

DIGITS = ["1", "2", "3", "4"]


def test_the_paper_protocols_values() -> None:
    p = spec("paper")
    assert p.image_size == (336, 336) and p.tile_cap and p.orderings == "shared"
    assert p.default_orderings == 5 and p.perm_avg == "random" and p.perm_avg_orders == 16
    assert (p.cot.max_new_tokens, p.cot.do_sample) == (1024, False)
    sc = p.self_consistency
    assert (sc.max_new_tokens, sc.temperature, sc.top_k, sc.samples) == (512, 0.7, 40, 10)
    assert spec("ours").orderings == "balanced" and OURS.perm_avg == "cyclic"
    with pytest.raises(ValueError, match="protocol"):
        spec("theirs")


@pytest.mark.parametrize(("n", "tiles"), [(2, 12), (4, 7), (8, 3), (12, 2), (30, 1)])
def test_tile_cap(n: int, tiles: int) -> None:
    assert tile_cap(n) == tiles


def test_orders_start_with_the_identity_and_are_distinct() -> None:
    orders = random_orders(4, 16, seed=0)
    assert orders.shape == (16, 4) and orders[0].tolist() == [0, 1, 2, 3]
    assert len({tuple(o) for o in orders}) == 16
    assert all(sorted(o) == [0, 1, 2, 3] for o in orders.tolist())
    assert random_orders(3, 16, seed=0).shape == (6, 3)  # at most N! orders
    assert not np.array_equal(random_orders(4, 5, 0), random_orders(4, 5, 0, PERM_AVG_STREAM))
    assert np.array_equal(random_orders(4, 5, 7), random_orders(4, 5, 7))


def test_shared_orderings_are_the_same_for_every_item() -> None:
    o = shared_orderings(4, 6, 5, seed=3)
    assert o.shape == (6, 5, 4) and (o == o[:1]).all()
    assert o[0, 0].tolist() == [0, 1, 2, 3]


def test_paper_layers_clip_to_the_depth() -> None:
    assert paper_layers(36, (21, 35)) == list(range(21, 36))
    assert paper_layers(28, (21, 35)) == list(range(21, 28))
    assert paper_layers(4, (21, 35)) is None and paper_layers(36, None) is None


def test_paper_prompts_byte_for_byte() -> None:
    intro = (
        "Given 4 images indexed from 1 to 4, identify the image that best matches the "
        "provided caption.\n"
    )
    assert cot_prompt_text("a cat", DIGITS, PAPER.cot.prompt) == (
        intro + "Please think step by step. First, write your reasoning inside <think> and "
        "</think> tags. Then, after the closing </think> tag, output only the final answer "
        "index (a single integer from 1 to 4).\nCaption: a cat\nAnswer: <think>"
    )
    assert cot_prompt_text("a cat", DIGITS, PAPER.self_consistency.prompt) == (
        intro + "Please think step by step to analyze the content of the images. After your "
        'reasoning, provide the final answer in the exact format: "The answer is <index>".\n'
        "Caption: a cat\nAnswer: "
    )


def test_vanilla_and_instruction_prompts_are_the_authors() -> None:
    from app.engine.labels import prompt_text

    intro = (
        "Given 4 images indexed from 1 to 4, identify the image that best matches the "
        "provided caption."
    )
    tail = " Respond with the index number only and nothing else.\nCaption: a cat\nAnswer: "
    assert prompt_text("a cat", DIGITS) == intro + tail
    fair = (
        " Please note that the provided images have been randomly shuffled, so it is "
        "essential to consider them fairly and without bias. Analyze the visual content "
        "objectively and do not be influenced by the order of the images."
    )
    assert prompt_text("a cat", DIGITS, "instruction") == intro + fair + tail
