"""Restricted trie scoring of the labels (DESIGN §2.1), checked against brute force.

The KV-cache ``step`` below (``cached_step``) is the template for the runner: one
prompt forward fills a DynamicCache; each trie depth gathers the cache rows it
needs into a fresh cache, extends the 2-D attention mask and the position ids, and
feeds the path tokens in one forward.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import pre_tokenizers
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

from app.engine.kv_cache import cache_argument
from app.engine.label_scoring import LabelTrie, StepFn, label_token_sequences, score_label_tries
from app.engine.labels import resolve_labels

# ---------------------------------------------------------------- trie structure

EOS = 99


def test_trie_structure_digits_1_to_12() -> None:
    # single-character tokens: "1" -> [1], "10" -> [1, 0], ...
    seqs = [[int(ch) for ch in str(k)] for k in range(1, 13)]
    trie = LabelTrie.build(seqs, eos_id=EOS)
    assert trie.root.choices == tuple(range(1, 10))
    one = trie.node([1])
    assert one.depth == 1 and one.path == (1,) and one.label == 0
    assert sorted(one.children) == [0, 1, 2]
    assert one.choices == (0, 1, 2, EOS)
    assert trie.node([2]).choices == () and not trie.node([2]).is_inner
    assert trie.node([1, 2]).label == 11
    assert trie.branching_nodes(1) == [trie.root.children[1]]
    # "1" = root choice "1" then EOS at node "1"; "11" = "1" then "1", no EOS (leaf)
    assert len(trie.label_steps[0]) == 2 and len(trie.label_steps[10]) == 2


def test_trie_rejects_bad_tokenisations() -> None:
    with pytest.raises(ValueError, match="identically"):
        LabelTrie.build([[1], [2], [1]], eos_id=EOS)
    with pytest.raises(ValueError, match="nothing"):
        LabelTrie.build([[1], []], eos_id=EOS)
    with pytest.raises(ValueError, match="end-of-sequence"):
        LabelTrie.build([[1, EOS]], eos_id=EOS)


class CountingStep:
    """A ``step`` that returns random logits and records every call's depth."""

    def __init__(self, vocab: int) -> None:
        self.vocab, self.depths = vocab, []
        self.gen = torch.Generator().manual_seed(0)

    def __call__(self, rows: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
        assert rows.dtype == torch.long and paths.shape[0] == rows.shape[0]
        self.depths.append(paths.shape[1])
        return 3 * torch.randn(rows.shape[0], self.vocab, generator=self.gen)


def test_single_token_labels_need_no_step() -> None:
    trie = LabelTrie.build([[10 + k] for k in range(9)], eos_id=EOS)
    logits = torch.randn(1, 128)
    step = CountingStep(128)
    (s,) = score_label_tries([trie], logits, step)
    assert step.depths == []
    expected = torch.log_softmax(logits[0, 10:19].double(), -1).numpy()
    np.testing.assert_allclose(s, expected, atol=1e-12)


def test_one_step_call_per_depth_batched_over_rows() -> None:
    digits = LabelTrie.build([[int(c) for c in str(k)] for k in range(1, 13)], eos_id=EOS)
    words = LabelTrie.build([[5, 6, 7], [5, 8], [9, 6, 7, 1]], eos_id=EOS)
    step = CountingStep(128)
    scores = score_label_tries([digits, words, digits], torch.randn(3, 128), step)
    # depth 1: node "1" of both digit rows + node "5" of the words row; depth 2: nothing
    # branches ("56" has one child); depth 3: nothing branches either
    assert step.depths == [1]
    for s in scores:
        assert math.isclose(np.exp(s).sum(), 1.0, abs_tol=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.integers(0, 6), min_size=1, max_size=4).map(tuple),
        min_size=1,
        max_size=12,
        unique=True,
    )
)
def test_scores_sum_to_one(seqs: list[tuple[int, ...]]) -> None:
    trie = LabelTrie.build(seqs, eos_id=EOS)
    step = CountingStep(128)
    (s,) = score_label_tries([trie], 3 * torch.randn(1, 128), step)
    assert s.shape == (len(seqs),) and s.dtype == np.float64
    assert math.isclose(np.exp(s).sum(), 1.0, abs_tol=1e-9)
    assert len(step.depths) == len(set(step.depths))  # at most one call per depth


# ---------------------------------------------------------------- tiny Qwen2 + KV cache


def build_tokenizer() -> Qwen2Tokenizer:
    """Byte-level Qwen2 tokenizer with no files: 256 byte symbols, no merges."""
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["<|endoftext|>"] = len(vocab)
    tok = Qwen2Tokenizer(
        vocab=vocab, merges=[], additional_special_tokens=["<|im_start|>", "<|im_end|>"]
    )
    tok.padding_side = "left"
    return tok


@pytest.fixture(scope="module")
def tiny_lm() -> tuple[Qwen2ForCausalLM, Qwen2Tokenizer]:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.15,  # peaked next-token distributions: scores spread over nats
        attn_implementation="sdpa",
    )
    model = Qwen2ForCausalLM(config).eval()
    return model, build_tokenizer()


def prompt_text(query: str) -> str:
    return f"<|im_start|>user\n{query}\nAnswer: <|im_end|>\n<|im_start|>assistant\n"


@torch.no_grad()
def cached_scores(
    model: Qwen2ForCausalLM,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    tries: list[LabelTrie],
) -> tuple[list[np.ndarray], list[int]]:
    """One prompt forward, then ``score_label_tries`` with a KV-cache ``step``."""
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    name = cache_argument(model.forward)  # the name this transformers version defines
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=True,
        **{name: cache},
        logits_to_keep=1,
    )
    lengths = attention_mask.sum(-1)  # next position id of every row
    depths: list[int] = []

    def cached_step(rows: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
        depths.append(paths.shape[1])
        # gather into a new cache: the prompt cache stays untouched for later depths
        sub = DynamicCache(
            [
                (layer.keys.index_select(0, rows), layer.values.index_select(0, rows))
                for layer in cache.layers
            ]
        )
        d = paths.shape[1]
        mask = torch.cat(
            [attention_mask.index_select(0, rows), attention_mask.new_ones(len(rows), d)], dim=1
        )
        pos = lengths.index_select(0, rows)[:, None] + torch.arange(d)
        step_out = model(
            input_ids=paths,
            attention_mask=mask,
            position_ids=pos,
            use_cache=True,
            **{name: sub},
            logits_to_keep=1,
        )
        return step_out.logits[:, -1]

    step: StepFn = cached_step
    return score_label_tries(tries, out.logits[:, -1], step), depths


def next_choices(seqs: list[list[int]], prefix: list[int], eos_id: int) -> list[int]:
    """Restricted set after ``prefix``, derived independently of LabelTrie."""
    k = len(prefix)
    longer = sorted({s[k] for s in seqs if len(s) > k and s[:k] == prefix})
    return longer + ([eos_id] if prefix in seqs and longer else [])


@torch.no_grad()
def brute_force_scores(
    model: Qwen2ForCausalLM, prompt_ids: list[int], seqs: list[list[int]], eos_id: int
) -> np.ndarray:
    """Teacher-forced: one uncached, unpadded forward per label over prompt + label."""
    scores = []
    for seq in seqs:
        logits = model(input_ids=torch.tensor([prompt_ids + seq])).logits[0].double()
        targets = seq + ([eos_id] if next_choices(seqs, seq, eos_id) else [])
        s = 0.0
        for k, target in enumerate(targets):
            choices = next_choices(seqs, seq[:k], eos_id)
            logp = torch.log_softmax(logits[len(prompt_ids) - 1 + k, choices], -1)
            s += float(logp[choices.index(target)])
        scores.append(s)
    return np.array(scores)


# (spec, N) per batch row, and the depths that need a cached step: digits branch at
# "1" (-> "0", "1", "2", EOS); byte-level words at "t", "f", "s", "e" and then "tw" (N=12)
CASES = {
    "digits12": ([("digits", 12), ("digits", 12)], [1]),
    "words12": ([("words", 12), ("words", 12)], [1, 2]),
    "mixed": ([("digits", 12), ("words", 7)], [1]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_cached_trie_scores_match_brute_force(
    tiny_lm: tuple[Qwen2ForCausalLM, Qwen2Tokenizer], case: str
) -> None:
    torch.set_num_threads(1)
    model, tok = tiny_lm
    eos_id = tok.convert_tokens_to_ids("<|im_end|>")
    queries = ["a dog on a red sofa", "two cats"]  # different lengths -> left padding
    batch = tok([prompt_text(q) for q in queries], padding=True, return_tensors="pt")
    assert (batch["attention_mask"][1] == 0).any()  # padding is exercised
    rows, expected_depths = CASES[case]
    label_sets = [resolve_labels(spec, n) for spec, n in rows]
    seqs = [label_token_sequences(tok, labels) for labels in label_sets]
    tries = [LabelTrie.build(s, eos_id) for s in seqs]

    scores, depths = cached_scores(model, batch["input_ids"], batch["attention_mask"], tries)

    assert depths == expected_depths  # one batched step per branching depth, rows together
    for i, query in enumerate(queries):
        prompt_ids = tok(prompt_text(query))["input_ids"]
        expected = brute_force_scores(model, prompt_ids, seqs[i], eos_id)
        assert scores[i].shape == (len(label_sets[i]),)
        np.testing.assert_allclose(scores[i], expected, atol=1e-5, rtol=0)
        assert math.isclose(np.exp(scores[i]).sum(), 1.0, abs_tol=1e-9)
        assert np.ptp(scores[i]) > 1.0  # a far from uniform distribution over labels
