"""Calibration (DESIGN §2.3): the rotated instances of M examples, and B and P from their evidence.

The one calibration build of the project: the service (through its queue) and the
evaluation (through batched forwards) both turn examples into instances here, run them
their own way, and hand the evidence back to :func:`estimate_calibration`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from app.method import debias

T = TypeVar("T")

Example = tuple[str, Sequence[T], int]
"""(query, images, answer): answer is the 0-based index of the matching image."""


@dataclass(frozen=True)
class Calibration:
    """B (N, N), rows = GT position t, and P (|Λ|, N), rows in the order of Λ; κ̂ when the
    calibration was estimated here (a stored profile does not keep it)."""

    bias_matrix: np.ndarray
    attention_prior: np.ndarray
    kappa: float | None = None

    @property
    def n(self) -> int:
        return int(self.bias_matrix.shape[0])

    @property
    def sink_layers(self) -> list[int]:
        """Indices into Λ of the layers whose prior starves a position (§2.4 sink guard)."""
        return [int(i) for i in np.flatnonzero(debias.sink_layers(self.attention_prior))]


def calibration_instances(
    examples: Sequence[Example[T]],
) -> tuple[list[tuple[str, list[T]]], np.ndarray]:
    """Every example under its N cyclic rotations: the (query, images') instances and, for
    each, the GT position t = perm.index(answer), so the GT visits every position once."""
    instances: list[tuple[str, list[T]]] = []
    gt: list[int] = []
    for query, images, answer in examples:
        n = len(images)
        for shift in range(n):
            instances.append((query, debias.rotate(images, shift)))
            gt.append(debias.rotated_position(answer, shift, n))
    return instances, np.asarray(gt, dtype=np.int64)


def example_of_size(example: Example[T], n: int, seed: int, index: int = 0) -> Example[T]:
    """The N-candidate version of an example with C >= N candidates (design §2.9): the GT
    plus N − 1 of its negatives, drawn without replacement by a generator seeded with
    (seed, N, index), kept in their original relative order; unchanged when N == C."""
    query, images, answer = example
    c = len(images)
    if not 2 <= n <= c or not 0 <= answer < c:
        raise ValueError(f"need 2 <= N <= C and 0 <= answer < C; got N={n}, C={c}, answer={answer}")
    negatives = [i for i in range(c) if i != answer]
    rng = np.random.default_rng([seed, n, index])
    kept = sorted([answer, *(int(i) for i in rng.choice(negatives, n - 1, replace=False))])
    return query, [images[i] for i in kept], kept.index(answer)


def multi_n_instances(
    examples: Sequence[Example[T]], sizes: Sequence[int], seed: int = 0
) -> dict[int, tuple[list[tuple[str, list[T]]], np.ndarray]]:
    """For every requested N: the rotated instances (and GT positions) of the examples cut
    to N candidates by :func:`example_of_size`; M·N instances per N, M·ΣN in all."""
    return {
        n: calibration_instances([example_of_size(ex, n, seed, m) for m, ex in enumerate(examples)])
        for n in sizes
    }


@dataclass(frozen=True)
class CalibrationStats:
    """The sufficient statistics of §2.3 in sums-and-counts form (DESIGN §2.8).

    Every estimate of a calibration is a mean of per-instance evidence, so offline
    calibration (rotated examples) and online feedback (served requests) accumulate the
    same sums and are combined by adding them:

    - ``row_sums`` (N, N): row t = Σ s over the instances whose GT sat at t; ``row_counts``
      (N,) how many; Lobs[t] = row_sums[t] / row_counts[t].
    - ``prior_sums`` (|Λ|, N): Σ a^(l) over instances; ``prior_count`` how many; P = the mean.
    """

    row_sums: np.ndarray
    row_counts: np.ndarray
    prior_sums: np.ndarray
    prior_count: int

    @classmethod
    def empty(cls, n: int, layers: int) -> CalibrationStats:
        return cls(np.zeros((n, n)), np.zeros(n, dtype=np.int64), np.zeros((layers, n)), 0)

    @classmethod
    def from_evidence(cls, scores: Any, attention: Any, gt_positions: Any) -> CalibrationStats:
        """Sums over R instances: scores (R, N) with their GT positions (R,), attention
        (R, |Λ|, N)."""
        s = np.asarray(scores, dtype=np.float64)
        a = np.asarray(attention, dtype=np.float64)
        gt = np.asarray(gt_positions, dtype=np.int64)
        if s.ndim != 2 or a.ndim != 3 or gt.shape != (s.shape[0],) or a.shape[0] != s.shape[0]:
            raise ValueError(
                f"need scores (R, N), attention (R, |Λ|, N), gt (R,); got {s.shape}, "
                f"{a.shape}, {gt.shape}"
            )
        n = s.shape[1]
        if np.any(gt < 0) or np.any(gt >= n):
            raise ValueError(f"gt_positions must lie in 0..{n - 1}")
        row_sums = np.zeros((n, n))
        np.add.at(row_sums, gt, s)
        return cls(
            row_sums, np.bincount(gt, minlength=n).astype(np.int64), a.sum(axis=0), int(a.shape[0])
        )

    @property
    def n(self) -> int:
        return int(self.row_sums.shape[0])

    def __add__(self, other: CalibrationStats) -> CalibrationStats:
        return CalibrationStats(
            self.row_sums + other.row_sums,
            self.row_counts + other.row_counts,
            self.prior_sums + other.prior_sums,
            self.prior_count + other.prior_count,
        )

    def observed_matrix(self) -> np.ndarray:
        """Lobs (N, N); every row needs at least one instance."""
        missing = np.flatnonzero(self.row_counts == 0)
        if missing.size:
            raise ValueError(
                f"no calibration instance has its GT at position(s) {missing.tolist()}; "
                "use all N rotations of each calibration example"
            )
        return self.row_sums / self.row_counts[:, None]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON lists (what a profile stores)."""
        return {
            "row_sums": self.row_sums.tolist(),
            "row_counts": self.row_counts.tolist(),
            "prior_sums": self.prior_sums.tolist(),
            "prior_count": int(self.prior_count),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CalibrationStats:
        return cls(
            np.asarray(data["row_sums"], dtype=np.float64),
            np.asarray(data["row_counts"], dtype=np.int64),
            np.asarray(data["prior_sums"], dtype=np.float64),
            int(data["prior_count"]),
        )


def blend(
    offline: CalibrationStats, feedback: CalibrationStats, min_row_count: int
) -> CalibrationStats:
    """Offline statistics plus feedback, count-weighted (DESIGN §2.8).

        Lobs[t] = (S_off[t] + [c_fb[t] >= m]·S_fb[t]) / (c_off[t] + [c_fb[t] >= m]·c_fb[t])
        P       = (A_off + A_fb) / (n_off + n_fb)

    A row with fewer than ``m = min_row_count`` feedback instances keeps its offline value
    (a handful of labels would only add noise); the prior needs no labels and always blends.
    """
    if feedback.row_sums.shape != offline.row_sums.shape or (
        feedback.prior_sums.shape != offline.prior_sums.shape
    ):
        raise ValueError("offline and feedback statistics have different shapes")
    trusted = feedback.row_counts >= max(1, min_row_count)
    return CalibrationStats(
        offline.row_sums + np.where(trusted[:, None], feedback.row_sums, 0.0),
        offline.row_counts + np.where(trusted, feedback.row_counts, 0),
        offline.prior_sums + feedback.prior_sums,
        offline.prior_count + feedback.prior_count,
    )


def estimate_from_stats(stats: CalibrationStats) -> Calibration:
    """B and κ̂ from the row means of the observed scores, P from the mean attention."""
    if stats.prior_count < 1:
        raise ValueError("no attention evidence: the prior needs at least one instance")
    l_obs = stats.observed_matrix()
    return Calibration(
        bias_matrix=debias.bias_from_observed(l_obs),
        attention_prior=stats.prior_sums / stats.prior_count,
        kappa=debias.visual_gain(l_obs),
    )


def estimate_calibration(scores: Any, attention: Any, gt_positions: Any) -> Calibration:
    """B and κ̂ from the scores (R, N) by GT position (R,), P from the attention (R, |Λ|, N):
    the same estimator as online refresh, through the sums of ``CalibrationStats``."""
    return estimate_from_stats(CalibrationStats.from_evidence(scores, attention, gt_positions))


def raw_position_share(scores: Any) -> np.ndarray:
    """Share of the instances (R, N) whose raw argmax (the model's own choice) is each
    position (N,). On the rotated calibration instances the GT visits every position
    equally often, so this is the model's position preference alone: the reference that
    live raw answers are compared with (the raw position-drift alert)."""
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 2 or s.shape[0] == 0:
        raise ValueError(f"scores must be (R, N) with R >= 1, got shape {s.shape}")
    return np.bincount(s.argmax(axis=1), minlength=s.shape[1]) / s.shape[0]
