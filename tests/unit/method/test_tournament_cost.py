"""The tournament's two advance rules and their cost (design §2.10): what a full ranking
(top_n = C, what the rerankers library always asks) costs against a top-1 rerank, as a
property over (candidates, window, top_n)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.method import tournament as T


def windows(c: int, w: int, top_n: int, rule: str = "auto") -> int:
    return sum(len(r) for r in T.window_sizes(c, w, top_n, rule))


def random_judge(seed: int):
    rng = np.random.default_rng(seed)

    def judge(ws: list[list[int]]) -> list[np.ndarray]:
        return [rng.dirichlet(np.ones(len(w))) for w in ws]

    return judge


@st.composite
def sizes(draw: st.DrawFn, most: int = 1200) -> tuple[int, int, int]:
    c = draw(st.integers(1, most))
    w = draw(st.integers(2, 64))
    top_n = draw(st.one_of(st.just(c), st.just(1), st.integers(1, c)))
    return c, w, top_n


@settings(max_examples=300, deadline=None)
@given(sizes())
def test_forwards_are_bounded_whatever_top_n(case: tuple[int, int, int]) -> None:
    c, w, top_n = case
    top_1 = windows(c, w, 1)
    spent = windows(c, w, top_n)
    bound = T.halving_bound(c, w)
    k = -(-c // w)
    assert bound <= 2 * k + max(0, math.ceil(math.log2(k)) - 1)
    assert windows(c, w, top_n, "halving") <= bound
    assert spent <= max(T.COST_FACTOR * top_1, bound)
    assert spent <= 2.06 * top_1 + 1e-9  # "at most ~2x a top-1 rerank"
    assert windows(c, w, 1, "halving") == windows(c, w, 1, "runners_up") == top_1
    rule = T.choose_rule(c, w, top_n)
    assert spent == windows(c, w, top_n, rule)
    assert (rule == "runners_up") == (windows(c, w, top_n, "runners_up") <= 2 * top_1)


@settings(max_examples=60, deadline=None)
@given(sizes(most=300), st.integers(0, 2**32 - 1), st.sampled_from(["auto", *T.RULES]))
def test_every_candidate_ranked_once_as_planned(
    case: tuple[int, int, int], seed: int, rule: str
) -> None:
    c, w, top_n = case
    t = T.run(c, w, random_judge(seed), top_n=top_n, seed=seed, rule=rule)
    assert sorted(t.ranking()) == list(range(c))
    planned = T.window_sizes(c, w, top_n, rule) if c > 1 else []  # one: nothing to play
    assert t.rounds_played == len(planned) and t.windows_played == sum(map(len, planned))
    score = t.relevance()
    assert np.all(np.diff(score[t.ranking()]) <= 0)


@pytest.mark.parametrize("rule", ["auto", *T.RULES])
def test_same_seed_same_ranking(rule: str) -> None:
    def rank(seed: int) -> list[int]:
        return T.run(64, 8, random_judge(5), top_n=64, seed=seed, rule=rule).ranking()

    assert rank(3) == rank(3)
    assert rank(3) != rank(4)


def test_full_ranking_of_64_costs_what_it_must() -> None:
    """Today's rule for top_n = 64 (53 windows at W = 12, 57 at W = 8) against halving."""
    assert windows(64, 12, 64, "runners_up") == 53 and windows(64, 8, 64, "runners_up") == 57
    assert T.choose_rule(64, 12, 64) == "halving"
    assert T.window_sizes(64, 12, 64) == [[11, 11, 11, 11, 10, 10], [12, 12, 12], [12, 12], [12]]
    assert windows(64, 12, 64) == 12 <= 2 * windows(64, 12, 1) == 14
    assert windows(64, 8, 64) == 15 <= 2 * windows(64, 8, 1) == 18
    assert windows(256, 12, 256) == 45 and windows(1000, 8, 1000) == 251


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 3000), st.integers(2, 64), st.integers(1, 3000))
def test_halving_fills_half_as_many_windows(remaining: int, w: int, top_n: int) -> None:
    """A round of k windows sends on what ⌈k/2⌉ full windows hold, never more than
    min(top_n, size − 1) of a window and never fewer than min(top_n, ⌊size/2⌋)."""
    sizes = T.split_sizes(remaining, w)
    going = T.advances(sizes, top_n, w, "halving")
    caps = T.advances(sizes, top_n, w, "runners_up")
    assert sum(going) == min(sum(caps), -(-len(sizes) // 2) * w)
    for s, a, cap in zip(sizes, going, caps, strict=True):
        assert min(top_n, s // 2) <= a <= cap


def test_small_top_n_keeps_the_knockout() -> None:
    """Where the runners-up tournament costs at most twice the top-1 one it runs as before
    (the exact top_n of a consistent judge), e.g. the docs' 8 documents, window 4, top 3."""
    assert T.choose_rule(8, 4, 3) == "runners_up"
    assert T.window_sizes(8, 4, 3) == [[4, 4], [3, 3], [4]]
    assert T.choose_rule(64, 12, 5) == "runners_up"
    assert T.window_sizes(16, 4, 3) == [[4, 4, 4, 4], [4, 4], [4]]  # 13 > 2 x 5: halving


def test_halving_keeps_the_true_top_of_a_consistent_judge() -> None:
    """Halving knocks a candidate out only behind ⌊s/2⌋ better ones of its window, so the
    true top ⌊s/2⌋ of the smallest window played stay in, in order."""
    for seed in range(20):
        values = np.random.default_rng(seed).permutation(64) / 8.0

        def oracle(ws: list[list[int]], v: np.ndarray = values) -> list[np.ndarray]:
            return [np.exp(v[w]) / np.exp(v[w]).sum() for w in ws]

        t = T.run(64, 12, oracle, top_n=64, seed=seed, rule="halving")
        smallest = min(min(r) for r in T.window_sizes(64, 12, 64, "halving")[:-1])
        assert t.ranking()[: smallest // 2] == list(np.argsort(-values)[: smallest // 2])


def test_rule_names_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown rule"):
        T.window_sizes(8, 4, 2, "swiss")
    with pytest.raises(ValueError, match="unknown rule"):
        T.Tournament(8, 4, 2, rule="swiss")
