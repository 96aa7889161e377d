"""The eager-hook capture (the fallback for attention outside transformers' interface):
forced onto a native family with 12 decoder layers (Λ = 7..11, so |Λ| > K), it equals the
SDPA capture, and only one layer's attention matrix is ever alive."""

from __future__ import annotations

import weakref

import numpy as np
import pytest
import torch

from app.engine.attention import (
    EAGER_HOOK_CAPTURE,
    capture,
    eager_attentions,
    install_row_hooks,
    span_mass,
)
from app.engine.runner import RetrievalItem, Runner
from lad_lab.testing.tiny_models import random_images

torch.set_num_threads(1)
LAYERS = 12


@pytest.fixture(scope="module")
def runners(shared_runner) -> tuple[Runner, Runner]:
    """The same tiny Qwen2.5-VL weights under the SDPA capture and under the eager hook."""
    sdpa = shared_runner("qwen2_5_vl", num_hidden_layers=LAYERS)
    hook = shared_runner("qwen2_5_vl", num_hidden_layers=LAYERS, capture=EAGER_HOOK_CAPTURE)
    return sdpa, hook


def _items() -> list[RetrievalItem]:
    """N = 3, 5 and 12 in one batch: left padding, and a folded "1" after t_q for N = 12."""
    images = random_images(12, seed=5, sizes=[(48, 48), (64, 40), (40, 72), (56, 56)])
    return [
        RetrievalItem("a red square", images[:3]),
        RetrievalItem("a striped cat on a blue sofa", images[3:8]),
        RetrievalItem("dogs", images),
    ]


@pytest.mark.parametrize("labels", ["digits", "words"])  # folded chain / cached steps
def test_eager_hook_equals_the_sdpa_capture(runners, labels: str) -> None:
    sdpa, hook = runners
    assert sdpa.layers == hook.layers == tuple(range(7, LAYERS))
    assert hook.attention_backend == "eager" and hook.capture == EAGER_HOOK_CAPTURE
    items = _items()
    a, b = sdpa.forward(items, labels), hook.forward(items, labels)
    for x, y in zip(a.attention, b.attention, strict=True):
        assert x.shape == y.shape == (len(hook.layers), x.shape[1])
        np.testing.assert_allclose(y, x, atol=1e-5, rtol=0)
    for x, y in zip(a.scores, b.scores, strict=True):
        # eager and SDPA round differently, so the scores agree to float32 noise, not bits
        np.testing.assert_allclose(y, x, atol=1e-5, rtol=0)
        assert int(np.argmax(x)) == int(np.argmax(y))
        assert abs(np.exp(y).sum() - 1) < 1e-9


def test_eager_hook_equals_the_eager_reference(runners) -> None:
    _, hook = runners
    items = _items()[:2]
    result = hook.forward(items)
    batch = hook.process(items)
    attentions = eager_attentions(hook.model, hook.adapter, batch, logits_to_keep=1)
    for row, n in enumerate(batch.n_images):
        spans = hook.adapter.image_spans(batch.input_ids[row], n)
        expected = span_mass(attentions, row, -1, hook.layers, spans)
        np.testing.assert_allclose(result.attention[row], expected, atol=1e-6, rtol=0)


def test_only_one_layer_matrix_is_alive_at_a_time(runners) -> None:
    """At the start of every decoder layer no earlier layer's (B, H, T, T) matrix is alive
    (each matrix is watched through a weak reference taken as its layer returns it); with
    output_attentions the count grows layer by layer, so the measurement can fail."""
    _, hook = runners
    batch = hook.process(_items()[:1])
    heads = hook.adapter.text_config().num_attention_heads
    shape = (1, heads, *batch.input_ids.shape[1:], batch.input_ids.shape[1])
    watched: list[weakref.ref] = []
    counts: list[int] = []

    def watch(module, args, output) -> None:  # runs before the capture's hook drops it
        assert tuple(output[1].shape) == shape
        watched.append(weakref.ref(output[1]))

    handles = []
    for module in hook.adapter.attention_modules():
        handles.append(module.register_forward_hook(watch, prepend=True))
        handles.append(
            module.register_forward_pre_hook(
                lambda *_: counts.append(sum(ref() is not None for ref in watched))
            )
        )
    try:
        with torch.inference_mode():
            with capture(hook.layers) as session:
                out = hook.model(**hook.adapter.prompt_kwargs(batch), logits_to_keep=1)
            assert counts == [0] * LAYERS
            assert out.attentions is None and sorted(session.rows) == list(hook.layers)
            assert session.matrix_bytes == 4 * int(np.prod(shape))  # one layer's float32 matrix
            counts.clear()
            watched.clear()
            hook.model(
                **hook.adapter.prompt_kwargs(batch), logits_to_keep=1, output_attentions=True
            )
            assert counts == list(range(LAYERS))  # the measurement sees retained matrices
    finally:
        for handle in handles:
            handle.remove()


class OldStyleAttention(torch.nn.Module):
    """An attention module of the pre-4.48 kind: weights only when output_attentions."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.weights = torch.softmax(
            torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(seed)), dim=-1
        )
        self.asked: list[bool] = []
        self.masks: list[torch.Tensor | None] = []

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
    ) -> tuple:
        self.asked.append(output_attentions)
        self.masks.append(attention_mask)
        return hidden_states, self.weights if output_attentions else None, "cache"


def test_hooks_ask_only_the_layers_of_lambda_for_weights() -> None:
    modules = [OldStyleAttention(seed) for seed in range(3)]
    install_row_hooks([*modules, None])  # None: a layer without softmax attention
    install_row_hooks(modules)  # idempotent
    hidden = torch.zeros(2, 4, 8)
    with capture((1,), query_index=torch.tensor([2, 3])) as session:
        outputs = [m(hidden, output_attentions=False) for m in modules]
    assert [m.asked for m in modules] == [[False], [True], [False]]
    # asked for weights without a mask: given the causal mask its SDPA path implies
    assert modules[0].masks == [None] and modules[2].masks == [None]
    mask = modules[1].masks[0]
    above = torch.ones(4, 4, dtype=torch.bool).triu(1)  # keys after the query
    assert mask.shape == (1, 1, 4, 4) and bool((mask[0, 0][above] < -1e30).all())
    assert bool((mask[0, 0][~above] == 0).all())
    assert all(out[1] is None and out[2] == "cache" for out in outputs)
    expected = modules[1].weights[[0, 1], :, [2, 3], :].mean(dim=1)
    torch.testing.assert_close(session.rows[1], expected)
    assert sorted(session.rows) == [1]
    assert modules[0](hidden, output_attentions=False)[1] is None  # no capture: untouched
    assert modules[1](hidden, output_attentions=True)[1] is modules[1].weights
