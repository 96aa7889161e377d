"""The label head (app/engine/label_scoring.py): while scoring, the output head computes
the label tokens' rows only, with the full head's values, and the scores do not change."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.engine.interface import RetrievalItem
from app.engine.label_scoring import install_label_head, label_head
from app.engine.labels import resolve_labels
from lad_lab.testing.tiny_models import random_images, tiny_runner
from tests.integration.engine.reference import brute_force_scores


@pytest.fixture(scope="module")
def runner():
    return tiny_runner("qwen2_5_vl")


def _item(n: int) -> RetrievalItem:
    return RetrievalItem(query="a red circle", images=random_images(n, seed=n))


def test_restricted_logits_are_the_full_heads_columns(runner) -> None:
    assert install_label_head(runner.model)  # a Linear head: restricted row-wise
    batch = runner.process([_item(3)])
    tokens = [16, 17, 18, int(runner.adapter.end_token_id())]
    with torch.inference_mode():
        full = runner.model(**runner.adapter.prompt_kwargs(batch), logits_to_keep=2).logits
        with label_head(tokens) as head:
            out = runner.model(**runner.adapter.prompt_kwargs(batch), logits_to_keep=2).logits
            assert head.restricted_calls == 1
            assert head.take(out) is out and head.restricted_calls == 0
    assert out.shape == (*full.shape[:-1], len(tokens))
    expected = full[..., sorted(tokens)]
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
    # outside the context the head is the full one again
    with torch.inference_mode():
        again = runner.model(**runner.adapter.prompt_kwargs(batch), logits_to_keep=1).logits
    assert again.shape[-1] == full.shape[-1]


def test_take_selects_from_full_logits_when_the_head_did_not_run() -> None:
    logits = torch.arange(24.0).reshape(1, 2, 12)
    with label_head([5, 2]) as head:
        taken = head.take(logits)
    assert head.columns == {2: 0, 5: 1}
    assert taken.tolist() == [[[2.0, 5.0], [14.0, 17.0]]]


@pytest.mark.parametrize("n", [4, 12])
def test_scores_with_the_label_head_equal_the_reference(runner, n: int) -> None:
    """Digits 1..12 fold "1" into the forward (two kept positions): both read label
    columns only, and match the brute-force teacher-forced scores on the full head."""
    item = _item(n)
    labels = resolve_labels("digits", n)
    result = runner.forward([item])
    np.testing.assert_allclose(
        result.scores[0], brute_force_scores(runner, item, labels), atol=1e-5, rtol=0
    )
    digits = {runner.adapter.tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)}
    first = {
        runner.adapter.tokenizer.convert_tokens_to_ids(str(d)) for d in range(1, n + 1) if d < 10
    }
    eos = int(runner.adapter.end_token_id())
    # the root's children, then "1"'s: "0", "1", "2" and the end of "1"
    expected = first if n < 10 else digits | {eos}
    assert runner.label_trie(labels).choice_tokens == expected
