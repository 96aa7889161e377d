"""Tournament.relevance: a score in [0, 1] that orders candidates exactly as the ranking,
across windows and rounds; with one window, the window's probability."""

from __future__ import annotations

import numpy as np
import pytest

from app.method.tournament import Tournament, run


@pytest.mark.parametrize(("candidates", "window", "top_n"), [(10, 4, 1), (17, 5, 2), (9, 3, 3)])
def test_relevance_orders_as_the_ranking(candidates: int, window: int, top_n: int) -> None:
    rng = np.random.default_rng(candidates)

    def judge(windows: list[list[int]]) -> list[np.ndarray]:
        return [rng.dirichlet(np.ones(len(w))) for w in windows]

    t = run(candidates, window, judge, top_n=top_n, seed=1)
    score = t.relevance()
    ranked = score[t.ranking()]
    assert np.all(np.diff(ranked) <= 0) and np.all((score >= 0) & (score <= 1))
    reached = t._reached  # every survivor of round r scores above every loser of round r
    for r in range(1, t.rounds_played):
        assert score[reached > r].min() >= score[reached == r].max()


def test_one_window_is_the_probability() -> None:
    t = Tournament(3, 3, 1, seed=0)
    (w,) = t.next_round()
    p = [0.2, 0.5, 0.3]
    t.record([p])
    assert np.allclose(t.relevance()[w], p) and np.allclose(t.relevance(), t.scores())


def test_relevance_needs_a_finished_tournament() -> None:
    with pytest.raises(ValueError, match="not finished"):
        Tournament(5, 2, 1, seed=0).relevance()
