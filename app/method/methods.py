"""The retrieval methods (DESIGN §2.4–§2.5) by name, applied to one forward's evidence.

The one method dispatch of the project. The method names are wire vocabulary
(``lad_client.vocabulary.METHODS``, re-exported here for the routes, the CLI and the evaluation).
Inputs are one instance (s (N,), a (|Λ|, N)) or a batch ((B, N), (B, |Λ|, N)).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.method import debias
from app.method.calibrate import Calibration
from lad_client.vocabulary import METHODS

NEEDS_CALIBRATION: frozenset[str] = frozenset({"agd", "pride", "attn_pure"})
"""Methods that apply a calibration (B and/or P)."""
MULTI_PASS: frozenset[str] = frozenset({"perm_avg"})
"""Methods that need the scores of all N cyclic rotations (N forward passes)."""


@dataclass(frozen=True)
class MethodConfig:
    """The inference hyper-parameters of §2.4: K, τ, the two variant switches, the sink guard
    (sink layers of the prior stay out of L*) and ``use_prior`` (False: the posterior without
    the prior division, P = ones; an ablation)."""

    top_k: int = 2
    tau: float = 5.0
    posterior_variant: str = "reference"
    mixture: str = "linear"
    sink_guard: bool = True
    use_prior: bool = True


@dataclass
class MethodOutput:
    """``probabilities`` (..., N) sum to 1 and their argmax is the prediction; the posterior π
    and the debiased scores d are set by the methods that compute them."""

    probabilities: np.ndarray
    posterior: np.ndarray | None = None
    debiased_scores: np.ndarray | None = None


def passes(method: str, n: int) -> int:
    """Forward passes the method needs for one instance of N candidates."""
    return n if method in MULTI_PASS else 1


def apply_method(
    method: str,
    scores: Any,
    attention: Any,
    calibration: Calibration | None = None,
    config: MethodConfig = MethodConfig(),
    rotated_scores: Sequence[Any] | None = None,
    orders: Sequence[Sequence[int]] | None = None,
) -> MethodOutput:
    """The answer of ``method`` for one instance or a batch.

    ``rotated_scores`` (perm_avg only): the scores of the N cyclic rotations, rotation r at
    index r, in position order ((N, N), or (B, N, N) for a batch); rotation 0 is ``scores``.
    ``orders`` (perm_avg only, default the N rotations): the K orderings those scores were
    taken under (order k shows image ``orders[k][p]`` at position p), then (K, N) or (B, K, N).
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; use one of {METHODS}")
    s = np.asarray(scores, dtype=np.float64)
    if method == "vanilla":
        return MethodOutput(debias.softmax(s))
    if method == "perm_avg":
        return _perm_avg(s, rotated_scores, orders)
    if method == "attn_raw":
        readout = debias.raw_attention_readout(attention, top_k=config.top_k)
        total = readout.sum(axis=-1, keepdims=True)
        uniform = np.full_like(readout, 1.0 / readout.shape[-1])
        return MethodOutput(np.where(total > 0, readout / np.where(total > 0, total, 1), uniform))
    if calibration is None:
        raise ValueError(f"method {method!r} needs a calibration (B and P)")
    if method == "pride":
        d = debias.pride_scores(s, calibration.bias_matrix)
        return MethodOutput(debias.softmax(d), debiased_scores=d)
    posterior = _posterior(attention, calibration, config)
    if method == "attn_pure":
        return MethodOutput(posterior, posterior=posterior)
    d = debias.debias_scores(s, calibration.bias_matrix, posterior, mixture=config.mixture)
    return MethodOutput(debias.softmax(d), posterior=posterior, debiased_scores=d)


def _posterior(attention: Any, calibration: Calibration, config: MethodConfig) -> np.ndarray:
    """Steps 1–3 of §2.4 under the config: the sink guard's layer mask, the prior or ones
    (without the prior division there is nothing for a sink layer to blow up: no guard)."""
    prior = np.asarray(calibration.attention_prior, dtype=np.float64)
    guarded = config.sink_guard and config.use_prior
    return debias.attention_posterior(
        attention,
        prior if config.use_prior else np.ones_like(prior),
        top_k=config.top_k,
        tau=config.tau,
        variant=config.posterior_variant,
        layer_mask=debias.allowed_layers(prior) if guarded else None,
    )


def _perm_avg(
    scores: np.ndarray, rotated_scores: Sequence[Any] | None, orders: Sequence[Sequence[int]] | None
) -> MethodOutput:
    """Scores of the N rotations (or of ``orders``) mapped back to image identity and
    averaged (§2.5)."""
    if rotated_scores is None:
        raise ValueError("perm_avg needs the scores of all N cyclic rotations")
    rotated = np.asarray(rotated_scores, dtype=np.float64)
    n = scores.shape[-1]
    perms = debias.rotations(n) if orders is None else [list(o) for o in orders]
    if rotated.ndim == 2:
        d = debias.permutation_average(rotated, perms)
    else:
        d = np.stack([debias.permutation_average(r, perms) for r in rotated])
    return MethodOutput(debias.softmax(d), debiased_scores=d)
