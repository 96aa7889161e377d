"""Generation for the cot / self_consistency baselines on a tiny random Qwen2.5-VL: the same
adapter and images-first prompt, seeded sampling, one result per item, costs counted."""

from __future__ import annotations

import pytest

from app.engine.interface import RetrievalItem
from lad_lab.demo import world
from lad_lab.eval.generate import generate_answers


@pytest.fixture(scope="module")
def runner(shared_runner):
    return shared_runner("qwen2_5_vl")


@pytest.fixture(scope="module")
def items() -> list[RetrievalItem]:
    examples = world.make_items(2, 3, "random", seed="eval", image_size=56)
    examples.append(world.make_item(5, 2, "random", seed="eval", image_size=56))  # N differs
    return [RetrievalItem(ex.query, ex.images) for ex in examples]


def test_greedy_is_deterministic_and_counts_tokens(runner, items) -> None:
    first = generate_answers(runner, items, max_new_tokens=5)
    again = generate_answers(runner, items, max_new_tokens=5)
    assert [g.texts for g in first] == [g.texts for g in again]
    for g in first:
        assert len(g.texts) == len(g.answers) == 1
        assert 1 <= g.forward_passes <= 5
        assert g.unparseable == sum(a is None for a in g.answers)
        assert all(a is None or 0 <= a < 3 for a in g.answers)


def test_sampling_is_seeded(runner, items) -> None:
    a = generate_answers(runner, items[:2], samples=4, temperature=0.7, max_new_tokens=4, seed=3)
    b = generate_answers(runner, items[:2], samples=4, temperature=0.7, max_new_tokens=4, seed=3)
    assert [g.texts for g in a] == [g.texts for g in b]
    assert all(len(g.texts) == 4 and 4 <= g.forward_passes <= 16 for g in a)
    c = generate_answers(runner, items[:2], samples=4, temperature=0.7, max_new_tokens=4, seed=4)
    assert [g.texts for g in c] != [g.texts for g in a]  # a random byte-level model varies


def test_several_samples_need_a_temperature(runner, items) -> None:
    with pytest.raises(ValueError, match="temperature"):
        generate_answers(runner, items[:1], samples=3, temperature=0.0)


def test_a_checkpoints_generation_config_is_not_inherited(runner, items) -> None:
    """Released Qwen-VL checkpoints ship top_k=1: the baselines must still sample."""
    from transformers import GenerationConfig

    saved = runner.model.generation_config
    runner.model.generation_config = GenerationConfig(
        top_k=1, top_p=0.001, do_sample=True, temperature=0.01
    )
    try:
        (g,) = generate_answers(
            runner, items[:1], samples=8, temperature=0.7, top_k=40, max_new_tokens=4, seed=1
        )
        assert len(set(g.texts)) > 1  # top_k=1 would give one path eight times
        assert runner.model.generation_config.top_k == 1  # restored after the call
        greedy = generate_answers(runner, items[:1], max_new_tokens=4)
        assert greedy[0].texts == generate_answers(runner, items[:1], max_new_tokens=4)[0].texts
    finally:
        runner.model.generation_config = saved
