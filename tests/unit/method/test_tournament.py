"""The windowed tournament (design §2.10) with oracle and position-biased judges."""

from __future__ import annotations

import numpy as np
import pytest

from app.method import tournament as T


def oracle(values: np.ndarray):
    """A judge that sees each candidate's true value (softmax over the window)."""

    def judge(windows: list[list[int]]) -> list[np.ndarray]:
        out = []
        for w in windows:
            z = np.exp(values[w] - values[w].max())
            out.append(z / z.sum())
        return out

    return judge


def test_window_sizes_are_near_equal_and_known_up_front() -> None:
    assert T.window_sizes(16, 8, 1) == [[8, 8], [2]]
    assert T.window_sizes(32, 8, 1) == [[8, 8, 8, 8], [4]]
    assert T.window_sizes(13, 12, 1) == [[7, 6], [2]]
    assert T.window_sizes(5, 8, 1) == [[5]]
    assert T.window_sizes(16, 8, 3) == [[8, 8], [6]]
    assert T.split_sizes(64, 12) == [11, 11, 11, 11, 10, 10]
    for bad in ((0, 8, 1), (8, 1, 1), (8, 4, 9), (8, 4, 0)):
        with pytest.raises(ValueError):
            T.window_sizes(*bad)


@pytest.mark.parametrize(("c", "w", "top_n"), [(16, 8, 1), (32, 8, 1), (64, 12, 5), (16, 4, 3)])
def test_oracle_judge_finds_the_true_top(c: int, w: int, top_n: int) -> None:
    """runners_up: the best top_n of every window advance, so a consistent judge's true top_n
    can never be knocked out."""
    values = np.random.default_rng(c).permutation(c).astype(float)
    t = T.run(c, w, oracle(values), top_n=top_n, seed=7, rule="runners_up")
    ranking = t.ranking()
    assert sorted(ranking) == list(range(c))
    assert ranking[:top_n] == list(np.argsort(-values)[:top_n])
    assert t.rounds_played == len(T.window_sizes(c, w, top_n, "runners_up"))
    assert t.windows_played == sum(len(r) for r in T.window_sizes(c, w, top_n, "runners_up"))


def test_same_seed_same_windows_other_seed_other_windows() -> None:
    def first_round(seed: int) -> list[list[int]]:
        return T.Tournament(32, 8, seed=seed).next_round()

    assert first_round(3) == first_round(3)
    assert first_round(3) != first_round(4)
    assert sorted(i for w in first_round(3) for i in w) == list(range(32))


def test_no_candidate_keeps_a_favoured_position() -> None:
    """Over seeds, candidate 0 lands at every position of its window about equally often."""
    counts = np.zeros(8)
    for seed in range(800):
        windows = T.Tournament(16, 8, seed=seed).next_round()
        w = next(w for w in windows if 0 in w)
        counts[w.index(0)] += 1
    assert counts.min() > 60 and counts.max() < 140  # expected 100 each


def test_a_judge_biased_to_position_0_is_beaten_by_shuffling() -> None:
    """A judge that always picks the first position: the winner is random, not candidate 0."""

    def first(windows: list[list[int]]) -> list[np.ndarray]:
        return [np.eye(len(w))[0] for w in windows]

    winners = {T.run(16, 8, first, seed=s).ranking()[0] for s in range(30)}
    assert len(winners) > 5


def test_record_checks_its_input() -> None:
    t = T.Tournament(8, 4)
    with pytest.raises(ValueError):
        t.record([[0.5, 0.5]])
    windows = t.next_round()
    with pytest.raises(ValueError):
        t.record([[1.0]] * len(windows))
    with pytest.raises(ValueError):
        t.ranking()
