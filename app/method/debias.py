"""Attention-guided debiasing (AGD): the math of DESIGN.md §2.3–§2.5, pure numpy.

Arrays in, arrays out: no torch, no I/O, no global state. Each public function is one
equation block of the design, named and commented with the paper's symbols:

    §2.3 calibration   rotations / rotate / rotated_position, observed_matrix (Lobs),
                       visual_gain (κ̂), estimate_bias_matrix (B), estimate_attention_prior (P)
    §2.4 inference     sink_layers / allowed_layers (the sink guard), select_layers (L*),
                       purified_attention_readout (p̃), sharpen (π),
                       attention_posterior (steps 1–3), expected_bias (β),
                       debias_scores (d = s − β)
    §2.5 baselines     pride_prior (g) / pride_scores, raw_attention_readout (ā),
                       permutation_average

Shapes: N candidate images (positions j, k, t), |Λ| candidate layers, R calibration
instances. Inference functions accept one instance or a leading batch dimension B.
Every result is float64. Bad input raises ValueError with a message naming the argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

EPS = 1e-20
SINK_THRESHOLD = 1e-6
"""A layer whose prior puts less than this on some position is a sink layer (§2.4)."""
VARIANTS = ("reference", "logmean")
MIXTURES = ("linear", "log")

T = TypeVar("T")


# --------------------------------------------------------------------------- validation


def _array(x: Any, name: str, ndims: tuple[int, ...], *, nonneg: bool = False) -> np.ndarray:
    """float64 copy of `x`, checked for rank, emptiness, NaN/inf and (optionally) sign."""
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a numeric array: {exc}") from None
    if arr.ndim not in ndims:
        want = " or ".join(f"{d}-D" for d in ndims)
        raise ValueError(f"{name} must be {want}, got shape {arr.shape}")
    if arr.size == 0 or arr.shape[-1] == 0:
        raise ValueError(f"{name} is empty (shape {arr.shape}); it needs N >= 1 candidates")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf; check the model outputs")
    if nonneg and np.any(arr < 0):
        raise ValueError(f"{name} must be non-negative (it holds attention mass)")
    return arr


def _top_k(top_k: Any) -> int:
    if isinstance(top_k, bool) or not isinstance(top_k, int | np.integer) or top_k < 1:
        raise ValueError(f"top_k must be an integer >= 1, got {top_k!r}")
    return int(top_k)


def _positive(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.number):
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def _attention_and_prior(attention: Any, prior: Any) -> tuple[np.ndarray, np.ndarray]:
    a = _array(attention, "attention", (2, 3), nonneg=True)
    p = _array(prior, "prior", (2,), nonneg=True)
    if a.shape[-2:] != p.shape:
        raise ValueError(
            f"attention has (|Λ|, N) = {a.shape[-2:]} but the attention prior has {p.shape}; "
            "use the profile calibrated for these layers and this number of images"
        )
    return a, p


# --------------------------------------------------------------------------- helpers


def softmax(x: Any, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax along `axis` (max-shifted)."""
    z = np.asarray(x, dtype=np.float64)
    z = z - np.max(z, axis=axis, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=axis, keepdims=True)


def ranking(probabilities: Any) -> list[int]:
    """Candidate indices by probability, best first; ties keep candidate order (stable), so
    ranking[0] is the argmax."""
    p = np.asarray(probabilities, dtype=np.float64)
    return [int(i) for i in np.argsort(-p, kind="stable")]


# --------------------------------------------------------------------------- §2.3 rotations


def rotations(n: int) -> list[list[int]]:
    """The N cyclic calibration orders: perm_r = [(i + r) % N for i in range(N)], r = 0..N-1.

    Position i of rotation r shows image perm_r[i], so the ground truth g visits every
    position exactly once over the N rotations.
    """
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    return [[(i + r) % n for i in range(n)] for r in range(n)]


def rotate(items: Sequence[T], shift: int) -> list[T]:
    """items' = [items[p] for p in perm] with perm = [(i + shift) % N for i in range(N)]."""
    n = len(items)
    if n == 0:
        raise ValueError("cannot rotate an empty sequence of images")
    return [items[(i + shift) % n] for i in range(n)]


def rotated_position(index: int, shift: int, n: int) -> int:
    """Where image `index` lands after rotate(·, shift): perm.index(index) = (index − shift) mod N.

    With index = g this is the GT position t of the rotated calibration instance.
    """
    if n < 1 or not 0 <= index < n:
        raise ValueError(f"index must be in 0..{n - 1}, got {index!r}")
    return (index - shift) % n


# --------------------------------------------------------------------------- §2.3 calibration


def observed_matrix(scores: Any, gt_positions: Any) -> np.ndarray:
    """Lobs (N, N): row t is the mean score vector s of the instances whose GT is at t.

    scores: (R, N) label log-probs of the R rotated instances; gt_positions: (R,) the GT
    position t of each. Every position 0..N-1 must hold the GT at least once.
    """
    s = _array(scores, "scores", (2,))
    gt = np.asarray(gt_positions)
    if gt.ndim != 1 or gt.shape[0] != s.shape[0]:
        raise ValueError(
            f"gt_positions must be 1-D with one entry per row of scores ({s.shape[0]}), "
            f"got shape {gt.shape}"
        )
    if gt.dtype.kind not in "iu":
        if gt.dtype.kind != "f" or not np.all(np.isfinite(gt)) or np.any(gt != np.round(gt)):
            raise ValueError("gt_positions must hold integer positions")
        gt = gt.astype(np.int64)
    n = s.shape[1]
    if np.any(gt < 0) or np.any(gt >= n):
        raise ValueError(f"gt_positions must lie in 0..{n - 1} (N = {n} candidates)")
    counts = np.bincount(gt, minlength=n)
    missing = np.flatnonzero(counts == 0)
    if missing.size:
        raise ValueError(
            f"no calibration instance has its GT at position(s) {missing.tolist()}; "
            "use all N rotations of each calibration example"
        )
    l_obs = np.zeros((n, n))
    np.add.at(l_obs, gt, s)
    return l_obs / counts[:, None]


def visual_gain(l_obs: Any) -> float:
    """κ̂ = max_{t≠j} (Lobs[t,t] − Lobs[t,j]), 0 if N = 1: the largest observed log-margin of
    the GT over any other position (the visual gain log γ)."""
    lo = _array(l_obs, "l_obs", (2,))
    n = lo.shape[0]
    if lo.shape != (n, n):
        raise ValueError(f"l_obs must be square (N, N), got {lo.shape}")
    if n == 1:
        return 0.0
    margins = np.diag(lo)[:, None] - lo  # Lobs[t,t] − Lobs[t,j]
    return float(np.max(margins[~np.eye(n, dtype=bool)]))


def estimate_bias_matrix(scores: Any, gt_positions: Any) -> np.ndarray:
    """Conditional bias matrix B (N, N) from rotated calibration instances.

    scores: (R, N) label log-probs s of the R rotated instances; gt_positions: (R,) the
    GT position t of each. With Lobs[t, :] the mean s over instances whose GT is at t,

        κ̂ = max_{t≠j} (Lobs[t,t] − Lobs[t,j])     (0 if N = 1)
        μ = mean(Lobs);  I = (μ − κ̂/N)·1 + κ̂·𝕀;  B = Lobs − I.

    κ̂ estimates the visual gain log γ of Pobs(j|t) ∝ Pbias(j|t)·γ^[j=t], so every row has
    B[t,t] <= B[t,j] (the bias never helps the GT) and B sums to 0. Off-diagonal
    differences B[t,j] − B[t,j'] are exactly Lobs[t,j] − Lobs[t,j'] (the bias log-ratio).
    Every position 0..N-1 must hold the GT at least once.
    """
    return bias_from_observed(observed_matrix(scores, gt_positions))


def bias_from_observed(l_obs: Any) -> np.ndarray:
    """B = Lobs − I (N, N) from an observed matrix however its rows were averaged
    (rotated calibration instances, production feedback, or both)."""
    l_obs = _array(l_obs, "l_obs", (2,))
    n = l_obs.shape[0]
    kappa = visual_gain(l_obs)
    mu = float(np.mean(l_obs))
    ideal = (mu - kappa / n) * np.ones((n, n)) + kappa * np.eye(n)
    return l_obs - ideal


def estimate_attention_prior(attention: Any) -> np.ndarray:
    """Attention prior P^(l)_k (|Λ|, N): the mean of a_k^(l) over all R = M·N instances.

    attention: (R, |Λ|, N) per-instance attention mass per layer and image position.
    """
    a = _array(attention, "attention", (3,), nonneg=True)
    return a.mean(axis=0)


# --------------------------------------------------------------------------- §2.4 inference


def sink_layers(prior: Any, threshold: float = SINK_THRESHOLD) -> np.ndarray:
    """Sink flags (|Λ|,) bool: layers whose prior has min_k P^(l)_k < threshold.

    Such a layer (seen in early layers that send all image attention to the first image)
    makes the division p̃_k = ā_k / p̄_k of step 2 explode at the starved positions.
    """
    p = _array(prior, "prior", (2,), nonneg=True)
    return p.min(axis=-1) < _positive(threshold, "threshold")


def allowed_layers(prior: Any, threshold: float = SINK_THRESHOLD) -> np.ndarray:
    """The sink guard's mask of Λ (|Λ|,) bool: True for the layers L* may use.

    Every layer but the sink layers; when every layer is a sink there is nothing better to
    use, so all of them stay allowed (the calibration response still names them).
    """
    flagged = sink_layers(prior, threshold)
    return ~flagged if not np.all(flagged) else np.ones_like(flagged)


def _layer_mask(mask: Any, layers: int) -> np.ndarray | None:
    if mask is None:
        return None
    m = np.asarray(mask)
    if m.dtype != bool or m.shape != (layers,):
        raise ValueError(f"layer_mask must be a bool array of shape ({layers},), got {m.shape}")
    if not m.any():
        raise ValueError("layer_mask allows no layer; L* needs at least one")
    return m


def select_layers(attention: Any, top_k: int, layer_mask: Any = None) -> np.ndarray:
    """L*: indices (into Λ) of the K layers with the largest image mass S^(l) = Σ_k a_k^(l).

    attention (|Λ|, N) -> (K,) or (B, |Λ|, N) -> (B, K), largest S first (ties: lower
    index first). K = min(top_k, |Λ|), so top_k >= |Λ| selects every layer.
    ``layer_mask`` (|Λ|,) bool, optional: only the True layers may enter L* (the sink
    guard), and K = min(top_k, number of allowed layers).
    """
    a = _array(attention, "attention", (2, 3), nonneg=True)
    mask = _layer_mask(layer_mask, a.shape[-2])
    mass = a.sum(axis=-1)  # S^(l)
    k = min(_top_k(top_k), a.shape[-2])
    if mask is not None:
        k = min(k, int(mask.sum()))
        mass = np.where(mask, mass, -np.inf)
    return np.argsort(-mass, axis=-1, kind="stable")[..., :k]


def _gather_layers(x: np.ndarray, layers: np.ndarray) -> np.ndarray:
    """x[..., L*, :] for per-instance layer indices (works with and without batch)."""
    return np.take_along_axis(x, layers[..., :, None], axis=-2)


def purified_attention_readout(
    attention: Any,
    prior: Any,
    *,
    top_k: int = 2,
    variant: str = "reference",
    eps: float = EPS,
    layer_mask: Any = None,
) -> np.ndarray:
    """Purified attention p̃_k (N,) or (B, N): attention over L* divided by the prior.

    "reference" (authors' code): ā_k = mean_{L*} a_k^(l); p̄_k = exp(mean_{L*} log(P^(l)_k + ε));
    p̃_k = ā_k / p̄_k.  "logmean" (paper's equation): log p̃_k = mean_{L*} (log a_k^(l) − log P^(l)_k).
    argmax p̃ is the attn_pure baseline. ``layer_mask``: the layers L* may use (see
    ``select_layers``; the sink guard passes ``allowed_layers(prior)``).
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {VARIANTS}")
    eps = _positive(eps, "eps")
    a, p = _attention_and_prior(attention, prior)
    layers = select_layers(a, top_k, layer_mask)
    a_sel = _gather_layers(a, layers)
    p_sel = _gather_layers(np.broadcast_to(p, a.shape), layers)
    if variant == "reference":
        a_bar = a_sel.mean(axis=-2)
        p_bar = np.exp(np.log(p_sel + eps).mean(axis=-2))
        return a_bar / p_bar
    return np.exp((np.log(a_sel + eps) - np.log(p_sel + eps)).mean(axis=-2))


def sharpen(purified: Any, tau: float = 5.0, eps: float = EPS) -> np.ndarray:
    """Posterior over the GT position: π = softmax(τ · log(p̃ + ε)) along the last axis."""
    tau = _positive(tau, "tau")
    eps = _positive(eps, "eps")
    p = _array(purified, "purified attention", (1, 2), nonneg=True)
    return softmax(tau * np.log(p + eps), axis=-1)


def attention_posterior(
    attention: Any,
    prior: Any,
    *,
    top_k: int = 2,
    tau: float = 5.0,
    variant: str = "reference",
    eps: float = EPS,
    layer_mask: Any = None,
) -> np.ndarray:
    """Steps 1–3 of §2.4: π (N,) from a^(l) (|Λ|, N) and P (|Λ|, N); π is ≥ 0 and sums to 1.

    attention may carry a leading batch dimension, (B, |Λ|, N) -> (B, N); the prior is
    shared. top_k >= |Λ| averages over every layer. ``layer_mask`` restricts L* (the
    sink guard); None is the reference math.
    """
    tau = _positive(tau, "tau")
    purified = purified_attention_readout(
        attention, prior, top_k=top_k, variant=variant, eps=eps, layer_mask=layer_mask
    )
    return sharpen(purified, tau=tau, eps=eps)


def expected_bias(bias_matrix: Any, posterior: Any, *, mixture: str = "linear") -> np.ndarray:
    """Step 4: β_j = Σ_k π_k B[k,j] ("linear") or log Σ_k π_k exp(B[k,j]) ("log").

    posterior (N,) -> (N,), or (B, N) -> (B, N). The "log" form is a stable logsumexp
    with log π_k = −inf where π_k = 0.
    """
    if mixture not in MIXTURES:
        raise ValueError(f"unknown mixture {mixture!r}; choose one of {MIXTURES}")
    b = _array(bias_matrix, "bias_matrix", (2,))
    pi = _array(posterior, "posterior", (1, 2), nonneg=True)
    n = pi.shape[-1]
    if b.shape != (n, n):
        raise ValueError(
            f"bias_matrix has shape {b.shape} but the posterior has N = {n}; "
            "use the profile calibrated for this number of images"
        )
    if not np.allclose(pi.sum(axis=-1), 1.0, atol=1e-6):
        raise ValueError("posterior must sum to 1 over the N positions")
    if mixture == "linear":
        return pi @ b
    with np.errstate(divide="ignore"):
        w = np.log(pi)[..., :, None] + b  # (…, k, j): log π_k + B[k,j]
    m = np.max(w, axis=-2, keepdims=True)  # finite: some π_k > 0
    return (m + np.log(np.sum(np.exp(w - m), axis=-2, keepdims=True)))[..., 0, :]


def debias_scores(
    scores: Any, bias_matrix: Any, posterior: Any, *, mixture: str = "linear"
) -> np.ndarray:
    """Step 5: debiased scores d = s − β (N,); the prediction is argmax d.

    scores and posterior are (N,) or both (B, N) for a batch; bias_matrix is (N, N).
    """
    s = _array(scores, "scores", (1, 2))
    pi = _array(posterior, "posterior", (1, 2), nonneg=True)
    if pi.shape != s.shape:
        raise ValueError(f"scores {s.shape} and posterior {pi.shape} must have the same shape")
    return s - expected_bias(bias_matrix, pi, mixture=mixture)


# --------------------------------------------------------------------------- §2.5 baselines


def pride_prior(bias_matrix: Any) -> np.ndarray:
    """PriDe's single global prior g_j = mean_k B[k,j] (N,): the bias with a uniform π."""
    b = _array(bias_matrix, "bias_matrix", (2,))
    if b.shape[0] != b.shape[1]:
        raise ValueError(f"bias_matrix must be square (N, N), got {b.shape}")
    return b.mean(axis=0)


def pride_scores(scores: Any, bias_matrix: Any) -> np.ndarray:
    """PriDe debiased scores d = s − g for (N,) or (B, N) scores."""
    s = _array(scores, "scores", (1, 2))
    g = pride_prior(bias_matrix)
    if g.shape[0] != s.shape[-1]:
        raise ValueError(f"bias_matrix is for N = {g.shape[0]} but scores have N = {s.shape[-1]}")
    return s - g


def raw_attention_readout(attention: Any, *, top_k: int = 2) -> np.ndarray:
    """ā_k = mean_{l in L*} a_k^(l) with no prior (N,) or (B, N); argmax is attn_raw."""
    a = _array(attention, "attention", (2, 3), nonneg=True)
    return _gather_layers(a, select_layers(a, top_k)).mean(axis=-2)


def permutation_average(scores_per_rotation: Any, perms: Sequence[Sequence[int]]) -> np.ndarray:
    """perm_avg: scores mapped back to image identity and averaged over orderings (N,).

    scores_per_rotation: (N_rot, N) in position order; perms[r][p] is the image shown at
    position p in ordering r. Returns mean_r s_r[perm_r^{-1}(i)] for each image i.
    """
    s = _array(scores_per_rotation, "scores_per_rotation", (2,))
    n_rot, n = s.shape
    perm_arr = np.asarray(perms)
    if perm_arr.shape != (n_rot, n) or perm_arr.dtype.kind not in "iu":
        raise ValueError(
            f"perms must be {n_rot} integer permutations of length {n}, got shape {perm_arr.shape}"
        )
    if np.any(np.sort(perm_arr, axis=1) != np.arange(n)):
        raise ValueError(f"every entry of perms must be a permutation of 0..{n - 1}")
    by_image = np.empty_like(s)
    np.put_along_axis(by_image, perm_arr, s, axis=1)  # by_image[r, perm[r][p]] = s[r, p]
    return by_image.mean(axis=0)
