"""Captured t_q attention rows (inside SDPA) equal eager attention, for every family."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.engine.attention import (
    CAPTURE_IMPLEMENTATION,
    capture,
    default_layers,
    eager_attentions,
    last_row_attention,
    span_mass,
)
from app.engine.label_scoring import chain_path, fold_batch
from app.engine.labels import resolve_labels
from app.engine.runner import RetrievalItem
from lad_lab.testing.tiny_models import FAMILIES, attention_layers, random_images

torch.set_num_threads(1)


def _items() -> list[RetrievalItem]:
    """Three rows with different images and different N, so two rows are left-padded."""
    images = random_images(9, seed=3, sizes=[(48, 48), (64, 40), (40, 72), (56, 56)])
    return [
        RetrievalItem("a red square", images[0:2]),
        RetrievalItem("a striped cat on a blue sofa", images[2:6]),
        RetrievalItem("dogs", images[6:9]),
    ]


@pytest.mark.parametrize("family", FAMILIES)
def test_capture_matches_eager(family: str, shared_runner) -> None:
    runner = shared_runner(family, layers=attention_layers(family))
    model, adapter = runner.model, runner.adapter
    assert adapter.text_attn_implementation() == CAPTURE_IMPLEMENTATION
    assert adapter.vision_attn_implementation() == "sdpa"

    items = _items()
    result = runner.forward(items)
    batch = runner.process(items)
    assert bool((batch.attention_mask[:, 0] == 0).any()), "expected left padding"
    spans = [adapter.image_spans(batch.input_ids[r], n) for r, n in enumerate(batch.n_images)]

    attentions = eager_attentions(model, adapter, batch, logits_to_keep=1)
    assert len(attentions) == runner.num_layers
    for row, row_spans in enumerate(spans):
        expected = span_mass(attentions, row, -1, runner.layers, row_spans)
        got = result.attention[row]
        assert got.shape == (len(runner.layers), batch.n_images[row])
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
        assert np.all(got > 0) and np.all(got.sum(axis=1) < 1.0 + 1e-6)


def test_capture_only_inside_context_and_only_layers_in_lambda(shared_runner) -> None:
    runner = shared_runner("qwen2_5_vl", layers=(1, 3))
    batch = runner.process(_items()[:1])
    kwargs = runner.adapter.prompt_kwargs(batch)
    with torch.inference_mode():
        with capture((1, 3)) as session:
            runner.model(**kwargs, logits_to_keep=1)
        assert sorted(session.rows) == [1, 3]
        assert session.rows[1].shape == batch.input_ids.shape
        torch.testing.assert_close(session.rows[1].sum(-1), torch.ones(1), atol=1e-5, rtol=0)
        with capture((0,)) as other:
            pass
        runner.model(**runner.adapter.prompt_kwargs(batch), logits_to_keep=1)
        assert other.rows == {}


@pytest.mark.parametrize("mask_kind", ["bool", "float", "none"])
def test_last_row_honours_masks_and_grouped_heads(mask_kind: str) -> None:
    gen = torch.Generator().manual_seed(0)
    batch, heads, kv_heads, length, dim = 2, 6, 2, 7, 8
    query = torch.randn(batch, heads, length, dim, generator=gen)
    key = torch.randn(batch, kv_heads, length, dim, generator=gen)
    allowed = torch.ones(batch, 1, length, length, dtype=torch.bool).tril()
    allowed[0, :, :, :3] = False  # row 0 left-padded by 3
    mask: torch.Tensor | None
    if mask_kind == "bool":
        mask = allowed
    elif mask_kind == "float":
        mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    else:
        mask, allowed = None, torch.ones_like(allowed).tril()
    got = last_row_attention(query, key, mask, 0.3)
    full_key = key.repeat_interleave(heads // kv_heads, dim=1)
    scores = (query @ full_key.transpose(-1, -2)) * 0.3
    scores = scores.masked_fill(~allowed, float("-inf"))
    expected = torch.softmax(scores, dim=-1)[:, :, -1, :].mean(dim=1)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    if mask_kind != "none":
        assert float(got[0, :3].abs().max()) == 0.0


@pytest.mark.parametrize("mask_kind", ["bool", "float", "none"])
def test_row_at_a_query_index_per_row(mask_kind: str) -> None:
    gen = torch.Generator().manual_seed(1)
    batch, heads, kv_heads, length, dim = 3, 4, 2, 9, 8
    query = torch.randn(batch, heads, length, dim, generator=gen)
    key = torch.randn(batch, kv_heads, length, dim, generator=gen)
    allowed = torch.ones(batch, 1, length, length, dtype=torch.bool).tril()
    allowed[0, :, :, :2] = False  # row 0 left-padded by 2, row 2 by 1
    allowed[2, :, :, :1] = False
    mask: torch.Tensor | None
    if mask_kind == "bool":
        mask = allowed
    elif mask_kind == "float":
        mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    else:
        mask, allowed = None, torch.ones_like(allowed).tril()
    index = torch.tensor([6, 8, 4])
    got = last_row_attention(query, key, mask, 0.25, index)
    full_key = key.repeat_interleave(heads // kv_heads, dim=1)
    scores = ((query @ full_key.transpose(-1, -2)) * 0.25).masked_fill(~allowed, float("-inf"))
    full = torch.softmax(scores, dim=-1).mean(dim=1)  # (B, Q, S)
    expected = full[torch.arange(batch), index]
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    assert float(got[2, 5:].abs().max()) == 0.0  # nothing after t_q
    default = last_row_attention(query, key, mask, 0.25)
    torch.testing.assert_close(default, full[:, -1], atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_folded_capture_matches_eager_at_t_q(family: str, shared_runner) -> None:
    """N=12 digits fold "1" after the prompt; the captured row is t_q's, not the last."""
    runner = shared_runner(family, layers=attention_layers(family)[1:])
    model, adapter = runner.model, runner.adapter
    images = random_images(12, seed=4, sizes=[(48, 48), (64, 40)])
    items = [RetrievalItem("a boat", images[:12]), RetrievalItem("two cats", images[:3])]
    result = runner.forward(items)
    chains = [chain_path(runner.label_trie(resolve_labels("digits", len(i.images)))) for i in items]
    assert [len(c) for c in chains] == [1, 0]
    batch, query_index = fold_batch(runner.process(items), chains, 0)
    assert batch.attention_mask[:, 0].tolist() == [1, 0], "row 1 left-padded"
    assert batch.attention_mask[:, -1].tolist() == [1, 1]  # row 0 ends with its chain
    assert query_index.tolist() == [batch.input_ids.shape[1] - 2, batch.input_ids.shape[1] - 1]

    attentions = eager_attentions(model, adapter, batch, use_cache=False)
    for row, item in enumerate(items):
        spans = adapter.image_spans(batch.input_ids[row], len(item.images))
        expected = span_mass(attentions, row, int(query_index[row]), runner.layers, spans)
        np.testing.assert_allclose(result.attention[row], expected, atol=1e-5, rtol=0)


def test_default_layers() -> None:
    assert default_layers(4) == (2, 3)
    assert default_layers(28) == tuple(range(16, 28))
    assert default_layers(1) == (0,)
    with pytest.raises(ValueError):
        default_layers(0)
