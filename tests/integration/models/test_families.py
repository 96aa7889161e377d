"""LLaVA-OneVision and InternVL end to end on tiny random models built in code.

What must hold for every family: the images of a prompt come first; each image's
token span R_k is found in a left-padded batch whose rows hold different N; the
runner's restricted label scores are a distribution equal to brute-force teacher
forcing; and the attention captured inside SDPA equals eager attention
(`output_attentions=True`) summed over the same spans.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from app.engine.attention import span_mass
from app.engine.labels import resolve_labels
from app.engine.runner import RetrievalItem, Runner
from app.models.internvl import InternVLAdapter
from app.models.llava_onevision import LlavaOnevisionAdapter, token_runs
from app.models.loader import load_runner, make_runner
from app.models.registry import adapter_for
from lad_lab.testing.tiny_models import build_tiny, random_images

torch.set_num_threads(1)

FAMILIES = ("llava_onevision", "internvl")
ADAPTERS = {"llava_onevision": LlavaOnevisionAdapter, "internvl": InternVLAdapter}
# (width, height) of the images of each row: different N and different aspect ratios
ROW_SIZES = ([(30, 40)], [(32, 32), (20, 50), (60, 20)], [(48, 48), (24, 36)])


def make_items(n_per_row: tuple[int, ...] = (1, 3, 2), seed: int = 0) -> list[RetrievalItem]:
    items = []
    for row, n in enumerate(n_per_row):
        sizes = ROW_SIZES[row % len(ROW_SIZES)]
        images = random_images(n, seed=seed + row, sizes=sizes)
        items.append(RetrievalItem(query=f"a photo number {row}", images=images))
    return items


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def runner(family: str) -> Runner:
    model, processor = build_tiny(family)
    return make_runner(model, processor, model_id=f"tiny-{family}")


def image_token_ids(runner: Runner) -> set[int]:
    """Every token that belongs to an image: placeholder plus delimiters."""
    adapter = runner.adapter
    ids = {int(runner.model.config.image_token_id)}
    if adapter.image_delimiters is not None:
        ids |= {adapter.token_id(t) for t in adapter.image_delimiters}
    return ids


def test_tiny_build_is_small_and_registered(family: str) -> None:
    model, processor = build_tiny(family, seed=1)
    text = model.config.text_config
    assert (text.hidden_size, text.num_hidden_layers) == (64, 4)
    assert (text.num_attention_heads, text.num_key_value_heads) == (4, 2)
    assert text.max_position_embeddings >= 2048
    assert adapter_for(model.config) is ADAPTERS[family]
    assert processor.tokenizer.padding_side == "left"


def test_prompt_puts_images_first_and_ends_with_generation_prompt(runner: Runner) -> None:
    adapter = runner.adapter
    prompt = adapter.render(3, "Caption: a dog\nAnswer: ")
    placeholder = runner.processor.image_token
    assert prompt.count(placeholder) == 3
    assert prompt.rindex(placeholder) < prompt.index("Caption: a dog")
    assert prompt.endswith("<|im_start|>assistant\n")
    assert adapter.end_token_id() == adapter.token_id("<|im_end|>")


def test_image_spans_cover_every_image_token_of_a_left_padded_batch(runner: Runner) -> None:
    items = make_items((1, 3, 2))
    batch = runner.process(items)
    mask = batch.attention_mask
    assert bool(mask[:, -1].all()), "rows must be left-padded"
    assert len(set(mask.sum(-1).tolist())) > 1, "rows should differ in length"
    image_ids = image_token_ids(runner)
    for row, item in enumerate(items):
        ids = batch.input_ids[row]
        spans = runner.adapter.image_spans(ids, len(item.images))
        assert len(spans) == len(item.images)
        first_real = int((mask[row] == 0).sum())
        assert first_real <= spans[0][0]
        assert all(s < e for s, e in spans)
        assert all(e <= s2 for (_, e), (s2, _) in itertools.pairwise(spans))
        n_image_tokens = sum(int(t) in image_ids for t in ids.tolist())
        assert sum(e - s for s, e in spans) == n_image_tokens
        for s, e in spans:
            assert all(int(t) in image_ids for t in ids[s:e].tolist())


def test_llava_onevision_spans_match_the_model_features_per_image() -> None:
    """Span k has exactly as many tokens as the model writes features for image k."""
    model, processor = build_tiny("llava_onevision")
    adapter = LlavaOnevisionAdapter(model, processor)
    items = make_items((1, 3, 2))
    prompts = [adapter.render(len(it.images), it.query) for it in items]
    batch = adapter.process(prompts, [list(it.images) for it in items])
    with torch.no_grad():
        features = model.model.get_image_features(
            pixel_values=batch.inputs["pixel_values"],
            image_sizes=batch.inputs["image_sizes"],
            batch_num_images=batch.inputs["batch_num_images"],
        ).pooler_output
    lengths = [f.shape[0] for f in features]
    spans = [adapter.image_spans(batch.input_ids[r], n) for r, n in enumerate(batch.n_images)]
    assert [e - s for row in spans for s, e in row] == lengths
    # a lone image is tiled (anyres) and costs more than an image of a multi-image prompt
    assert lengths[0] > lengths[1]


def test_llava_onevision_refuses_a_run_it_cannot_split() -> None:
    model, processor = build_tiny("llava_onevision")
    adapter = LlavaOnevisionAdapter(model, processor)
    image = adapter.image_token_id()
    ids = torch.tensor([1, 2, *([image] * 51), 3])
    assert adapter.image_spans(ids, 3) == [(2, 19), (19, 36), (36, 53)]
    with pytest.raises(ValueError, match="cannot split"):
        adapter.image_spans(ids, 4)
    assert token_runs([image, 5, image, image], image) == [(0, 1), (2, 4)]


def test_captured_attention_equals_eager_attention(family: str, runner: Runner) -> None:
    items = make_items((1, 3, 2), seed=3)
    result = runner.forward(items)
    for scores, attention, item in zip(result.scores, result.attention, items, strict=True):
        n = len(item.images)
        assert scores.shape == (n,)
        assert np.exp(scores).sum() == pytest.approx(1.0, abs=1e-9)
        assert attention.shape == (len(runner.layers), n)
        assert np.all(attention >= 0) and np.all(attention.sum(-1) <= 1 + 1e-6)

    eager, _ = build_tiny(family)  # same seed, same weights
    eager.set_attn_implementation(runner.adapter.attn_implementation("eager", "sdpa"))
    batch = runner.process(items)
    with torch.no_grad():
        out = eager(**runner.adapter.prompt_kwargs(batch), output_attentions=True)
    for row, item in enumerate(items):
        spans = runner.adapter.image_spans(batch.input_ids[row], len(item.images))
        expected = span_mass(out.attentions, row, -1, runner.layers, spans)
        np.testing.assert_allclose(result.attention[row], expected, atol=1e-5, rtol=0)


def test_trie_scores_equal_teacher_forced_scores_of_each_row_alone(runner: Runner) -> None:
    """N=12 digit labels need a cached step ("1" -> "0".."2" or end); rows are gathered."""
    items = make_items((12, 2, 3), seed=5)
    result = runner.forward(items)
    eos = runner.adapter.end_token_id()
    for row, item in enumerate(items):
        trie = runner.label_trie(resolve_labels("digits", len(item.images)))
        alone = runner.process([item])
        node_logp: dict[int, torch.Tensor] = {}
        for index, node in enumerate(trie.nodes):
            if not node.is_branching:
                continue
            inputs = dict(alone.inputs)
            path = torch.tensor([list(node.path)], dtype=torch.long)
            inputs["input_ids"] = torch.cat([alone.input_ids, path], dim=1)
            inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
            with torch.no_grad():
                logits = runner.model(**inputs).logits[0, -1].double()
            node_logp[index] = torch.log_softmax(logits[list(node.choices)], dim=-1)
        expected = [
            sum(float(node_logp[k][c]) for k, c in steps if trie.nodes[k].is_branching)
            for steps in trie.label_steps
        ]
        assert any(node.is_branching and eos in node.choices for node in trie.nodes) == (
            len(item.images) >= 10
        )
        np.testing.assert_allclose(result.scores[row], expected, atol=1e-5, rtol=0)


def test_saved_model_loads_offline_and_scores_alike(family: str, tmp_path: Path) -> None:
    """save_pretrained -> load_runner: the processor is rebuilt with its own settings."""
    model, processor = build_tiny(family, seed=2)
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    loaded = load_runner(str(tmp_path), device="cpu", layers=(1, 3), threads=1)
    assert isinstance(loaded.adapter, ADAPTERS[family])
    assert loaded.adapter.chat_template() == processor.chat_template
    in_memory = make_runner(model, processor, layers=(1, 3))
    items = make_items((1, 3, 2), seed=7)
    a, b = in_memory.forward(items), loaded.forward(items)
    for x, y in zip(a.scores + a.attention, b.scores + b.attention, strict=True):
        np.testing.assert_allclose(x, y, atol=1e-6, rtol=0)
