"""The refresh of a calibration from feedback, and its guard (DESIGN §2.8): pure arithmetic.

The service (``app.service.online``) and the streaming evaluation (``lad_lab.eval.stream``)
both decide here, so what the evaluation measures is what the service does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from app.method.calibrate import Calibration, CalibrationStats, blend, estimate_from_stats
from app.method.calibration_diagnostics import DIAGNOSTIC_METHODS, accuracy_with
from app.method.methods import MethodConfig

GUARD_METHOD = "agd"
"""The method whose held-out accuracy decides whether a refresh goes live."""

HeldOut = Sequence[tuple[np.ndarray, np.ndarray, int]]
"""Held-out feedback: (scores (N,), attention (|Λ|, N), correct position) per request."""


PRIOR_SOURCES = ("feedback", "served")
"""Where a refresh takes the prior P from: the labelled feedback, or every served request
(P needs no labels: more evidence, including requests that never get feedback)."""


class FeedbackSums(Protocol):
    """The running sums of one profile's feedback, as a store snapshot holds them
    (``calibration_store.evidence.FeedbackSnapshot``): named here so the math reads no
    store."""

    row_sums: np.ndarray
    row_counts: np.ndarray
    prior_sums: np.ndarray
    prior_count: int
    unlabelled_prior_sums: np.ndarray
    unlabelled_count: int


def online_stats(snap: FeedbackSums, prior: str = "feedback") -> CalibrationStats:
    """The feedback statistics of a store snapshot, as the estimator's sums and counts."""
    if prior not in PRIOR_SOURCES:
        raise ValueError(f"unknown prior source {prior!r}; use one of {PRIOR_SOURCES}")
    if prior == "served":
        return CalibrationStats(
            snap.row_sums, snap.row_counts, snap.unlabelled_prior_sums, snap.unlabelled_count
        )
    return CalibrationStats(snap.row_sums, snap.row_counts, snap.prior_sums, snap.prior_count)


@dataclass(frozen=True)
class RefreshOutcome:
    """The blended calibration and the guard's verdict on it."""

    calibration: Calibration
    live: bool
    reason: str
    accuracy_live: float | None
    accuracy_refreshed: float | None
    held_out: int
    trusted_rows: list[int]
    held_out_by_method: dict[str, dict[str, float]] | None = None
    """Held-out accuracy of vanilla, attn_pure and agd with the live and the refreshed
    calibration (the refresh's diagnostics); None without held-out feedback."""


def _stacked(held: HeldOut) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        np.stack([h[0] for h in held]),
        np.stack([h[1] for h in held]),
        np.array([h[2] for h in held]),
    )


def held_out_accuracy(
    calibration: Calibration,
    held: HeldOut,
    config: MethodConfig,
    methods: tuple[str, ...] = (GUARD_METHOD,),
) -> dict[str, float] | None:
    """Accuracy per method on held-out feedback (None when there is none)."""
    if not held:
        return None
    return accuracy_with(calibration, *_stacked(held), config, methods)


def refresh_calibration(
    live: Calibration,
    offline: CalibrationStats,
    feedback: CalibrationStats,
    held: HeldOut,
    config: MethodConfig,
    *,
    min_row_count: int,
    min_holdout: int,
    force: bool = False,
) -> RefreshOutcome:
    """Blend ``feedback`` into the live version's ``offline`` statistics and judge the blend
    against ``live`` on ``held``: it goes live when at least as accurate there (ties go
    live: the blend rests on more evidence), or when ``force``."""
    new = estimate_from_stats(blend(offline, feedback, min_row_count))
    by_method = None
    if held:
        by_method = {
            "live": held_out_accuracy(live, held, config, DIAGNOSTIC_METHODS),
            "refreshed": held_out_accuracy(new, held, config, DIAGNOSTIC_METHODS),
        }
    acc_live = by_method["live"][GUARD_METHOD] if by_method else None
    acc_new = by_method["refreshed"][GUARD_METHOD] if by_method else None
    n = len(held)
    if force:
        go, reason = True, "forced by the operator (force=true): the guard was skipped"
    elif n < min_holdout:
        go, reason = (
            False,
            (
                f"only {n} held-out feedback instance(s); the guard needs "
                f"{min_holdout} (LAD_REFRESH_MIN_HOLDOUT)"
            ),
        )
    elif acc_new is not None and acc_live is not None and acc_new >= acc_live:
        go, reason = (
            True,
            (
                f"held-out {GUARD_METHOD} accuracy {acc_new:.3f} >= live "
                f"{acc_live:.3f} on {n} instances"
            ),
        )
    else:
        go, reason = (
            False,
            (
                f"would lose accuracy: held-out {GUARD_METHOD} accuracy "
                f"{acc_new:.3f} < live {acc_live:.3f} on {n} instances"
            ),
        )
    trusted = [int(t) for t in np.flatnonzero(feedback.row_counts >= max(1, min_row_count))]
    return RefreshOutcome(new, go, reason, acc_live, acc_new, n, trusted, by_method)
