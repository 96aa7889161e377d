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

from app.engine import debias

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

    def allowed_layers(self, guard: bool = True) -> np.ndarray | None:
        """The mask of Λ that L* may use: the sink guard's when ``guard``, else None (all)."""
        return debias.allowed_layers(self.attention_prior) if guard else None


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


def estimate_calibration(scores: Any, attention: Any, gt_positions: Any) -> Calibration:
    """B and κ̂ from the scores (R, N) by GT position (R,), P from the attention (R, |Λ|, N)."""
    return Calibration(
        bias_matrix=debias.estimate_bias_matrix(scores, gt_positions),
        attention_prior=debias.estimate_attention_prior(attention),
        kappa=debias.visual_gain(debias.observed_matrix(scores, gt_positions)),
    )


def raw_position_share(scores: Any) -> np.ndarray:
    """Share of the instances (R, N) whose raw argmax (the model's own choice) is each
    position (N,). On the rotated calibration instances the GT visits every position
    equally often, so this is the model's position preference alone: the reference that
    live raw answers are compared with (the raw position-drift alert)."""
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 2 or s.shape[0] == 0:
        raise ValueError(f"scores must be (R, N) with R >= 1, got shape {s.shape}")
    return np.bincount(s.argmax(axis=1), minlength=s.shape[1]) / s.shape[0]
