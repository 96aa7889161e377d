"""The windowed knockout tournament that reranks more candidates than one prompt holds
(design §2.10): pure bookkeeping, no model.

Each round the surviving candidates are shuffled (a generator seeded per request) and dealt
into k = ceil(R / W) windows of near-equal size (sizes differ by at most one), so no
candidate is systematically shown at a favoured position. The caller scores every window
of a round (all of them in one batch of forward passes) and hands back each window's
probabilities, in the window's position order. The best of each window go on (how many:
the rule, below); a round whose survivors fit in one window is the final. The ranking
orders candidates by the round they reached, then by their probability in the last window
they played, then by index.

The window sizes of every round depend only on (C, W, top_n), never on the answers, so
:func:`window_sizes` tells the caller up front which N it needs a profile for.

Two rules say how many of a window advance, and :func:`choose_rule` picks one from
(C, W, top_n) alone, so the cost is known before the first forward:

* ``runners_up``: the best ``min(top_n, size − 1)`` (the winner, and runners-up for
  top_n > 1). With a judge that orders every window consistently, the ranking's first
  top_n are the true top_n. Its cost grows with top_n: a full ranking (top_n = C) drops one
  candidate per window per round, about W·ln(C/W) windows (53 for C = 64, W = 12).
* ``halving``: successive halving, filled. Each round plays at most half as many windows
  as the one before, ⌈k/2⌉, and as many advance as those windows hold (near-equal shares
  of ⌈k/2⌉·W, at most min(top_n, size − 1) of a window, at least min(top_n, ⌊size/2⌋)). Round 1
  scores every candidate once (k = ⌈C/W⌉ windows) and every later round refines the best
  of the one before, in full windows, so the whole costs at most ``halving_bound(C, W)`` =
  Σ_j ⌈k / 2^j⌉ ≤ 2k + ⌈log2 k⌉ − 1 windows whatever top_n. The exact-top_n property holds
  for top_n ≤ ⌊s/2⌋ of every window played.

``choose_rule`` keeps ``runners_up`` whenever it costs at most ``COST_FACTOR`` (2) times
the top-1 tournament of the same (C, W), and takes ``halving`` otherwise; for top_n = 1
both are the top-1 tournament. So no tournament costs more than max(2·F1, halving_bound),
F1 the top-1 tournament's windows (≤ 2.06·F1 for every C ≤ 2000, W ≤ 64).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np


def split_sizes(remaining: int, window: int) -> list[int]:
    """Near-equal window sizes for ``remaining`` candidates, each at most ``window``."""
    k = -(-remaining // window)
    base, extra = divmod(remaining, k)
    return [base + 1] * extra + [base] * (k - extra)


RULES: tuple[str, ...] = ("runners_up", "halving")
"""How many of a window advance (see the module docstring); ``"auto"`` is ``choose_rule``."""
COST_FACTOR = 2
"""``runners_up`` runs while it costs at most this many times the top-1 tournament."""


def advances(sizes: Sequence[int], top_n: int, window: int, rule: str) -> list[int]:
    """How many of each window of a round (``sizes``, in order) go on under ``rule``."""
    caps = [min(top_n, s - 1) for s in sizes]
    if rule == "runners_up":
        return caps
    if rule != "halving":
        raise ValueError(f"unknown rule {rule!r}; expected one of {RULES}")
    room = -(-len(sizes) // 2) * window  # what the next round's ⌈k/2⌉ windows hold
    if sum(caps) <= room:
        return caps
    # near-equal shares of the room, the larger ones to the first windows (the larger ones
    # in split_sizes' order, where no share is above its window's cap: caps differ by one)
    base, extra = divmod(room, len(sizes))
    shares = [base + 1] * extra + [base] * (len(sizes) - extra)
    return [min(a, cap) for a, cap in zip(shares, caps, strict=True)]


def _rounds(candidates: int, window: int, top_n: int, rule: str) -> list[list[int]]:
    rounds, remaining = [], candidates
    while True:
        sizes = split_sizes(remaining, window)
        rounds.append(sizes)
        if len(sizes) == 1:
            return rounds
        remaining = sum(advances(sizes, top_n, window, rule))


def _windows(rounds: list[list[int]]) -> int:
    return sum(len(r) for r in rounds)


def choose_rule(candidates: int, window: int, top_n: int) -> str:
    """``runners_up`` when it costs at most ``COST_FACTOR`` times the top-1 tournament of
    the same candidates and window, else ``halving`` (from the sizes alone)."""
    _check(candidates, window, top_n)
    runners_up = _windows(_rounds(candidates, window, top_n, "runners_up"))
    top_1 = _windows(_rounds(candidates, window, 1, "runners_up"))
    return "runners_up" if runners_up <= COST_FACTOR * top_1 else "halving"


def _resolve(candidates: int, window: int, top_n: int, rule: str) -> str:
    if rule == "auto":
        return choose_rule(candidates, window, top_n)
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}; expected auto or one of {RULES}")
    return rule


def window_sizes(candidates: int, window: int, top_n: int, rule: str = "auto") -> list[list[int]]:
    """The window sizes of every round, final included (independent of the answers)."""
    _check(candidates, window, top_n)
    return _rounds(candidates, window, top_n, _resolve(candidates, window, top_n, rule))


def halving_bound(candidates: int, window: int) -> int:
    """The most windows a ``halving`` tournament plays, whatever top_n: Σ_j ⌈k / 2^j⌉ down
    to 1, k = ⌈C/W⌉ (round r + 1 sends on at most what ⌈k_r / 2⌉ windows hold)."""
    k, total = -(-candidates // window), 0
    while True:
        total += k
        if k <= 1:
            return total
        k = -(-k // 2)


def _check(candidates: int, window: int, top_n: int) -> None:
    if candidates < 1 or window < 2 or not 1 <= top_n <= candidates:
        raise ValueError(
            f"need candidates >= 1, window >= 2 and 1 <= top_n <= candidates; got "
            f"candidates={candidates}, window={window}, top_n={top_n}"
        )


@dataclass
class Tournament:
    """One request's tournament: ``next_round`` → score its windows → ``record``, until
    ``next_round`` returns None; then ``ranking`` and ``scores``."""

    candidates: int
    window: int
    top_n: int = 1
    seed: int = 0
    rule: str = "auto"  # "runners_up", "halving", or "auto" (choose_rule; resolved here)
    rounds_played: int = 0
    windows_played: int = 0
    _alive: list[int] = field(default_factory=list)
    _pending: list[list[int]] | None = None
    _reached: np.ndarray = field(default_factory=lambda: np.zeros(0))
    _score: np.ndarray = field(default_factory=lambda: np.zeros(0))
    _done: bool = False

    def __post_init__(self) -> None:
        _check(self.candidates, self.window, self.top_n)
        self.rule = _resolve(self.candidates, self.window, self.top_n, self.rule)
        self._rng = np.random.default_rng(self.seed)
        self._alive = list(range(self.candidates))
        self._reached = np.zeros(self.candidates, dtype=np.int64)
        self._score = np.zeros(self.candidates, dtype=np.float64)
        if self.candidates == 1:
            self._score[0], self._done = 1.0, True

    def next_round(self) -> list[list[int]] | None:
        """The windows of the next round (candidate indices in position order), or None."""
        if self._done:
            return None
        if self._pending is None:
            order = [self._alive[i] for i in self._rng.permutation(len(self._alive))]
            windows, start = [], 0
            for size in split_sizes(len(order), self.window):
                windows.append(order[start : start + size])
                start += size
            self._pending = windows
        return [list(w) for w in self._pending]

    def record(self, probabilities: Sequence[Sequence[float]]) -> None:
        """Each window's probabilities (position order) for the round ``next_round`` gave."""
        windows = self._pending
        if windows is None:
            raise ValueError("record() without a pending round: call next_round() first")
        if len(probabilities) != len(windows) or any(
            len(p) != len(w) for p, w in zip(probabilities, windows, strict=True)
        ):
            raise ValueError("one probability per candidate of every window, in order")
        self.rounds_played += 1
        self.windows_played += len(windows)
        final = len(windows) == 1
        survivors: list[int] = []
        going = advances([len(w) for w in windows], self.top_n, self.window, self.rule)
        for w, p, a in zip(windows, probabilities, going, strict=True):
            p = np.asarray(p, dtype=np.float64)
            idx = np.asarray(w)
            self._reached[idx] = self.rounds_played
            self._score[idx] = p
            if not final:
                survivors += [w[i] for i in np.argsort(-p, kind="stable")[:a]]
        self._pending = None
        self._alive = sorted(survivors)
        self._done = final

    @property
    def done(self) -> bool:
        return self._done

    def ranking(self) -> list[int]:
        """Every candidate, best first: round reached, then last probability, then index."""
        if not self._done:
            raise ValueError("the tournament is not finished")
        keys = np.lexsort((np.arange(self.candidates), -self._score, -self._reached))
        return [int(i) for i in keys]

    def scores(self) -> np.ndarray:
        """Each candidate's probability in the last window it played."""
        return self._score.copy()

    def relevance(self) -> np.ndarray:
        """A score in [0, 1] that orders candidates as ``ranking`` does, across windows:
        ``(r - 1 + p) / R`` (r: the round reached, p: the last probability, R: the rounds
        played). A candidate eliminated in round r scores at most r / R, one that reached a
        later round more (equal only if an eliminated p were 1, which would leave its
        window's survivors at 0); with one round it is p itself."""
        if not self._done:
            raise ValueError("the tournament is not finished")
        rounds = max(self.rounds_played, 1)
        return (np.maximum(self._reached, 1) - 1 + self._score) / rounds


Judge = Callable[[list[list[int]]], Sequence[Sequence[float]]]
"""Scores one round: its windows (candidate indices in position order) -> probabilities."""


def run(
    candidates: int,
    window: int,
    judge: Judge,
    top_n: int = 1,
    seed: int = 0,
    rule: str = "auto",
) -> Tournament:
    """Drive a tournament with a synchronous ``judge(windows) -> probabilities per window``
    (the evaluation's way; the service drives :class:`Tournament` itself, asynchronously)."""
    t = Tournament(candidates, window, top_n, seed, rule)
    while (windows := t.next_round()) is not None:
        t.record(judge(windows))
    return t
