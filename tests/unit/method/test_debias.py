"""Properties and a hand-checked example of the AGD math (app/method/debias.py, DESIGN §2.3-5)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from app.method import debias as D

FAST = settings(max_examples=60, deadline=None)


def _floats(lo: float, hi: float) -> st.SearchStrategy[float]:
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False, width=64)


@st.composite
def calibration(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """Scores (M*N, N) with every GT position present, in rotation order."""
    n = draw(st.integers(1, 7))
    m = draw(st.integers(1, 3))
    scores = draw(hnp.arrays(np.float64, (m * n, n), elements=_floats(-20, 5)))
    gt = np.tile(np.arange(n), m)
    return scores, gt


@st.composite
def attention_case(
    draw: st.DrawFn, batch: bool = False, floor: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    layers = draw(st.integers(1, 5))
    n = draw(st.integers(1, 7))
    shape = (draw(st.integers(1, 4)), layers, n) if batch else (layers, n)
    attention = draw(hnp.arrays(np.float64, shape, elements=_floats(floor, 1)))
    prior = draw(hnp.arrays(np.float64, (layers, n), elements=_floats(1e-4, 1)))
    return attention, prior


def _rotated_calibration(content: np.ndarray, gts: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Content-only scores: each rotated instance shows example m's per-image scores permuted."""
    n = content.shape[1]
    scores, positions = [], []
    for m, g in enumerate(gts):
        for r, perm in enumerate(D.rotations(n)):
            scores.append(content[m][perm])
            positions.append(D.rotated_position(g, r, n))
    return np.array(scores), np.array(positions)


def _top2_gap(x: np.ndarray) -> float:
    return float(np.diff(np.sort(x)[-2:])[0]) if x.size > 1 else np.inf


# ------------------------------------------------------------------ calibration (§2.3)


@FAST
@given(calibration())
def test_bias_never_helps_the_gt(case: tuple[np.ndarray, np.ndarray]) -> None:
    scores, gt = case
    b = D.estimate_bias_matrix(scores, gt)
    n = b.shape[0]
    assert b.shape == (n, n)
    assert np.all(np.diag(b)[:, None] <= b + 1e-9)
    assert abs(b.sum()) < 1e-8 * max(1.0, np.abs(scores).max() * n * n)


@FAST
@given(
    n=st.integers(2, 7),
    seed=st.integers(0, 2**32 - 1),
    log_gamma=_floats(0.0, 6.0),
    m=st.integers(1, 3),
)
def test_bias_matrix_recovers_planted_conditional_bias(
    n: int, seed: int, log_gamma: float, m: int
) -> None:
    """Pobs(j|t) ∝ Pbias(j|t)·γ^[j=t]: off-diagonal log-ratios are recovered exactly;
    the diagonal is only known relative to the most GT-favouring pair, γ cancels, and each
    row is determined only up to a constant (normalisers and per-instance offsets)."""
    rng = np.random.default_rng(seed)
    p_bias = rng.dirichlet(np.ones(n), size=n)  # row t: Pbias(·|t)
    log_bias = np.log(p_bias)

    def planted_scores(lg: float) -> np.ndarray:
        log_obs = log_bias + lg * np.eye(n)
        rows = [np.log(D.softmax(log_obs[t])) + rng.normal() for _ in range(m) for t in range(n)]
        return np.array(rows)  # each instance: normalised, plus an arbitrary offset

    gt = np.tile(np.arange(n), m)
    b = D.estimate_bias_matrix(planted_scores(log_gamma), gt)
    for t in range(n):
        others = [j for j in range(n) if j != t]
        for j in others:
            for jj in others:
                want = log_bias[t, j] - log_bias[t, jj]
                assert abs((b[t, j] - b[t, jj]) - want) < 1e-9
    ratio = np.diag(log_bias)[:, None] - log_bias  # log Pbias(t|t) − log Pbias(j|t)
    off = ~np.eye(n, dtype=bool)
    want_diag = ratio - ratio[off].max()
    got_diag = np.diag(b)[:, None] - b
    assert np.allclose(got_diag[off], want_diag[off], atol=1e-9)
    b_other_gamma = D.estimate_bias_matrix(planted_scores(log_gamma + 2.5), gt)
    centred = b - b.mean(axis=1, keepdims=True)
    assert np.allclose(centred, b_other_gamma - b_other_gamma.mean(axis=1, keepdims=True))


@FAST
@given(n=st.integers(1, 6), seed=st.integers(0, 2**32 - 1), m=st.integers(1, 4))
def test_content_only_scores_have_no_bias(n: int, seed: int, m: int) -> None:
    """No position effect, GT vs distractor only: rows constant off the diagonal (B is 0)."""
    rng = np.random.default_rng(seed)
    gts = rng.integers(0, n, size=m).tolist()
    content = np.repeat(rng.normal(-3, 1, size=(m, 1)), n, axis=1)
    content[np.arange(m), gts] = rng.normal(0, 1, size=m)
    scores, positions = _rotated_calibration(content, gts)
    b = D.estimate_bias_matrix(scores, positions)
    for t in range(n):
        row = np.delete(b[t], t)
        assert np.allclose(row, row[0] if row.size else 0.0, atol=1e-9)
    assert np.allclose(b, 0.0, atol=1e-9)


@FAST
@given(n=st.integers(2, 6), seed=st.integers(0, 2**32 - 1), m=st.integers(1, 4))
def test_content_only_per_image_scores_give_a_circulant_bias(n: int, seed: int, m: int) -> None:
    """Arbitrary fixed per-image scores: B[t, j] depends only on (j − t) mod N, so its
    rows are cyclic shifts of one another and the PriDe prior is constant (no preference)."""
    rng = np.random.default_rng(seed)
    gts = rng.integers(0, n, size=m).tolist()
    content = rng.normal(size=(m, n))
    scores, positions = _rotated_calibration(content, gts)
    b = D.estimate_bias_matrix(scores, positions)
    for t in range(n):
        assert np.allclose(b[t], np.roll(b[0], t), atol=1e-9)
    assert np.allclose(D.pride_prior(b), D.pride_prior(b)[0], atol=1e-9)


def test_missing_gt_position_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"position\(s\) \[2\]"):
        D.estimate_bias_matrix(np.zeros((2, 3)), [0, 1])


def test_single_candidate_gives_zero_bias() -> None:
    assert D.estimate_bias_matrix([[-0.3], [-0.1]], [0, 0]).tolist() == [[0.0]]


def test_attention_prior_is_the_instance_mean() -> None:
    a = np.array([[[0.1, 0.3]], [[0.3, 0.1]], [[0.2, 0.5]]])
    assert np.allclose(D.estimate_attention_prior(a), [[0.2, 0.3]])


def test_rotations_put_the_gt_once_at_every_position() -> None:
    images = ["a", "b", "c", "d"]
    for g in range(4):
        seen = []
        for r, perm in enumerate(D.rotations(4)):
            assert D.rotate(images, r) == [images[p] for p in perm]
            t = D.rotated_position(g, r, 4)
            assert perm.index(g) == t and D.rotate(images, r)[t] == images[g]
            seen.append(t)
        assert sorted(seen) == [0, 1, 2, 3]


# ------------------------------------------------------------------ inference (§2.4)


@FAST
@given(attention_case(batch=True), st.sampled_from(D.VARIANTS), st.integers(1, 6), _floats(0.1, 20))
def test_posterior_is_a_distribution(
    case: tuple[np.ndarray, np.ndarray], variant: str, top_k: int, tau: float
) -> None:
    attention, prior = case
    pi = D.attention_posterior(attention, prior, top_k=top_k, tau=tau, variant=variant)
    assert pi.shape == attention.shape[:1] + attention.shape[2:]
    assert np.all(pi >= 0)
    assert np.allclose(pi.sum(axis=-1), 1.0)


@FAST
@given(attention_case(), st.sampled_from(D.VARIANTS), st.integers(0, 3))
def test_top_k_at_least_all_layers_uses_every_layer(
    case: tuple[np.ndarray, np.ndarray], variant: str, extra: int
) -> None:
    attention, prior = case
    eps, tau = D.EPS, 3.0
    if variant == "reference":
        ptilde = attention.mean(0) / np.exp(np.log(prior + eps).mean(0))
    else:
        ptilde = np.exp((np.log(attention + eps) - np.log(prior + eps)).mean(0))
    want = D.softmax(tau * np.log(ptilde + eps))
    got = D.attention_posterior(
        attention, prior, top_k=attention.shape[0] + extra, tau=tau, variant=variant
    )
    assert np.allclose(got, want, rtol=1e-9, atol=1e-12)


@FAST
@given(attention_case(batch=True, floor=1e-8))
def test_variants_coincide_for_a_single_selected_layer(case: tuple[np.ndarray, np.ndarray]) -> None:
    # attention mass exactly 0 is where ε enters the two forms differently (0 vs ε/P)
    attention, prior = case
    ref = D.attention_posterior(attention, prior, top_k=1, variant="reference")
    logmean = D.attention_posterior(attention, prior, top_k=1, variant="logmean")
    assert np.allclose(ref, logmean, rtol=1e-9, atol=1e-12)


@FAST
@given(
    bias=hnp.arrays(np.float64, (4, 4), elements=_floats(-5, 5)),
    k=st.integers(0, 3),
    scores=hnp.arrays(np.float64, (4,), elements=_floats(-10, 0)),
)
def test_log_mixture_equals_linear_for_one_hot_posterior(
    bias: np.ndarray, k: int, scores: np.ndarray
) -> None:
    pi = np.eye(4)[k]
    lin = D.debias_scores(scores, bias, pi, mixture="linear")
    log = D.debias_scores(scores, bias, pi, mixture="log")
    assert np.allclose(lin, log, atol=1e-12)
    assert np.allclose(lin, scores - bias[k], atol=1e-12)


@FAST
@given(
    bias=hnp.arrays(np.float64, (3, 3), elements=_floats(-900, 900)),
    logits=hnp.arrays(np.float64, (3,), elements=_floats(-50, 50)),
)
def test_log_mixture_is_stable_and_between_min_and_max(
    bias: np.ndarray, logits: np.ndarray
) -> None:
    beta = D.expected_bias(bias, D.softmax(logits), mixture="log")
    assert np.all(np.isfinite(beta))
    assert np.all(beta >= bias.min(axis=0) - 1e-9) and np.all(beta <= bias.max(axis=0) + 1e-9)


@FAST
@given(calibration(), st.data())
def test_constant_shift_of_scores_changes_no_prediction(
    case: tuple[np.ndarray, np.ndarray], data: st.DataObject
) -> None:
    cal_scores, gt = case
    n = cal_scores.shape[1]
    b = D.estimate_bias_matrix(cal_scores, gt)
    s = data.draw(hnp.arrays(np.float64, (n,), elements=_floats(-10, 0)))
    pi = D.softmax(data.draw(hnp.arrays(np.float64, (n,), elements=_floats(-5, 5))))
    c = data.draw(_floats(-50, 50))
    # a constant on the test instance: every mixture and PriDe
    debiasers = [
        lambda bm, x: D.debias_scores(x, bm, pi, mixture="linear"),
        lambda bm, x: D.debias_scores(x, bm, pi, mixture="log"),
        lambda bm, x: D.pride_scores(x, bm),
    ]
    for debias in debiasers:
        d, d_shift = debias(b, s), debias(b, s + c)
        assert np.allclose(d_shift - d, c, atol=1e-9)
        if _top2_gap(d) > 1e-6:
            assert np.argmax(d_shift) == np.argmax(d)
    # a constant per calibration instance: B changes by row constants, which the linear
    # mixture and PriDe turn into a constant over positions
    offsets = data.draw(hnp.arrays(np.float64, (len(gt), 1), elements=_floats(-50, 50)))
    b_shift = D.estimate_bias_matrix(cal_scores + offsets, gt)
    for debias in debiasers[0::2]:
        d, d_shift = debias(b, s), debias(b_shift, s)
        assert np.allclose(d_shift - d, (d_shift - d)[0], atol=1e-8)
        if _top2_gap(d) > 1e-6:
            assert np.argmax(d_shift) == np.argmax(d)


@FAST
@given(attention_case(batch=True), st.sampled_from(D.MIXTURES), st.data())
def test_batch_equals_per_instance_loop(
    case: tuple[np.ndarray, np.ndarray], mixture: str, data: st.DataObject
) -> None:
    attention, prior = case
    batch, _, n = attention.shape
    scores = data.draw(hnp.arrays(np.float64, (batch, n), elements=_floats(-10, 0)))
    bias = data.draw(hnp.arrays(np.float64, (n, n), elements=_floats(-3, 3)))
    pi = D.attention_posterior(attention, prior, top_k=2, variant="logmean")
    d = D.debias_scores(scores, bias, pi, mixture=mixture)
    raw = D.raw_attention_readout(attention, top_k=2)
    pride = D.pride_scores(scores, bias)
    for i in range(batch):
        pi_i = D.attention_posterior(attention[i], prior, top_k=2, variant="logmean")
        assert np.allclose(pi[i], pi_i, rtol=1e-12, atol=1e-15)
        assert np.allclose(d[i], D.debias_scores(scores[i], bias, pi_i, mixture=mixture))
        assert np.allclose(raw[i], D.raw_attention_readout(attention[i], top_k=2))
        assert np.allclose(pride[i], D.pride_scores(scores[i], bias))


def test_select_layers_picks_largest_image_mass() -> None:
    a = np.array([[0.1, 0.1], [0.5, 0.4], [0.3, 0.3], [0.6, 0.0]])  # S = .2 .9 .6 .6
    assert D.select_layers(a, 2).tolist() == [1, 2]
    assert D.select_layers(a, 9).tolist() == [1, 2, 3, 0]
    assert D.select_layers(np.stack([a, a[::-1]]), 1).tolist() == [[1], [2]]


# ------------------------------------------------------------------ worked example, N = 3


def test_worked_example_by_hand() -> None:
    # two instances with the GT at 0 average to Lobs[0] = [0, -1, -2]
    scores = [[1, -1, -3], [-1, -1, -1], [-1, 0, -1], [-3, -2, 0]]
    b = D.estimate_bias_matrix(scores, [0, 0, 1, 2])
    # κ̂ = 3 (t=2, j=0); μ = -10/9; I_off = μ - κ̂/3 = -19/9; I_diag = 8/9
    want_b = np.array([[-8, 10, 1], [10, -8, 10], [-8, 1, -8]]) / 9
    assert np.allclose(b, want_b, atol=1e-12)

    # S = (.3, .8, .7) -> L* = {1, 2}; ā = (.25, .3, .2); p̄ = geometric mean = .2
    attention = [[0.1, 0.1, 0.1], [0.2, 0.4, 0.2], [0.3, 0.2, 0.2]]
    prior = [[0.9, 0.9, 0.9], [0.1, 0.2, 0.4], [0.4, 0.2, 0.1]]
    assert np.allclose(D.raw_attention_readout(attention), [0.25, 0.3, 0.2])
    # p̃ = (1.25, 1.5, 1); with τ = 1, π = p̃ / Σ p̃ = (1/3, 2/5, 4/15)
    pi = D.attention_posterior(attention, prior, tau=1.0)
    assert np.allclose(pi, [1 / 3, 2 / 5, 4 / 15], atol=1e-12)
    # logmean: p̃_k = sqrt(a_k^(1) a_k^(2)) / .2 = (sqrt 1.5, sqrt 2, 1)
    want_lm = np.array([np.sqrt(1.5), np.sqrt(2.0), 1.0])
    pi_lm = D.attention_posterior(attention, prior, tau=1.0, variant="logmean")
    assert np.allclose(pi_lm, want_lm / want_lm.sum(), atol=1e-12)

    # β = π B = (-4/45, 2/45, 11/45); the debiased prediction flips from 2 to 0
    s = np.array([-1.0, -1.05, -0.9])
    d = D.debias_scores(s, b, pi)
    assert np.allclose(d, s - np.array([-4, 2, 11]) / 45, atol=1e-12)
    assert np.argmax(s) == 2 and np.argmax(d) == 0
    assert np.allclose(D.softmax(d).sum(), 1.0)
    # PriDe: g = column means of B = (-2/9, 1/9, 1/9)
    assert np.allclose(D.pride_prior(b), [-2 / 9, 1 / 9, 1 / 9], atol=1e-12)
    assert np.argmax(D.pride_scores(s, b)) == 0


# ------------------------------------------------------------------ baselines (§2.5)


@FAST
@given(
    content=hnp.arrays(np.float64, (5,), elements=_floats(-10, 0)),
    seed=st.integers(0, 2**32 - 1),
)
def test_permutation_average_returns_content_scores(content: np.ndarray, seed: int) -> None:
    cyclic = D.rotations(5)
    shuffled = [np.random.default_rng(seed + r).permutation(5).tolist() for r in range(3)]
    for perms in (cyclic, shuffled):
        by_position = np.array([content[perm] for perm in perms])  # position p shows perm[p]
        assert np.allclose(D.permutation_average(by_position, perms), content, atol=1e-12)


def test_permutation_average_averages_per_image() -> None:
    got = D.permutation_average([[1.0, 2.0], [5.0, 7.0]], [[0, 1], [1, 0]])
    assert np.allclose(got, [(1 + 7) / 2, (2 + 5) / 2])


# ------------------------------------------------------------------ validation


_A = np.full((3, 4), 0.25)
_B = np.zeros((4, 4))
_PI = np.full(4, 0.25)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: D.estimate_bias_matrix(np.zeros(4), [0]), "2-D"),
        (lambda: D.estimate_bias_matrix(np.zeros((4, 4)), [0, 1, 2]), "one entry per row"),
        (lambda: D.estimate_bias_matrix(np.zeros((2, 2)), [0, 2]), r"0\.\.1"),
        (lambda: D.estimate_bias_matrix(np.zeros((2, 2)), [0.5, 1]), "integer"),
        (lambda: D.estimate_bias_matrix([[0.0, np.nan], [0, 0]], [0, 1]), "NaN"),
        (lambda: D.estimate_bias_matrix([[0.0, np.inf], [0, 0]], [0, 1]), "NaN or inf"),
        (lambda: D.estimate_attention_prior(_A), "3-D"),
        (lambda: D.estimate_attention_prior(-_A[None]), "non-negative"),
        (lambda: D.attention_posterior(_A, _A[:, :3]), "prior"),
        (lambda: D.attention_posterior(_A[0], _A), "2-D or 3-D"),
        (lambda: D.attention_posterior(-_A, _A), "non-negative"),
        (lambda: D.attention_posterior(_A, np.where(_A > 0, np.nan, 0)), "NaN"),
        (lambda: D.attention_posterior(_A, _A, variant="mean"), "unknown variant"),
        (lambda: D.attention_posterior(_A, _A, tau=0.0), "tau"),
        (lambda: D.attention_posterior(_A, _A, tau=-1.0), "tau"),
        (lambda: D.attention_posterior(_A, _A, top_k=0), "top_k"),
        (lambda: D.raw_attention_readout(_A, top_k=1.5), "top_k"),
        (lambda: D.debias_scores(np.zeros(3), _B, _PI), "same shape"),
        (lambda: D.debias_scores(np.zeros(4), _B[:3], _PI), "bias_matrix"),
        (lambda: D.debias_scores(np.zeros(4), _B, _PI * 2), "sum to 1"),
        (lambda: D.debias_scores(np.zeros(4), _B, _PI, mixture="mix"), "unknown mixture"),
        (lambda: D.debias_scores(np.full(4, np.nan), _B, _PI), "NaN"),
        (lambda: D.pride_scores(np.zeros(3), _B), "N = 4"),
        (lambda: D.permutation_average(np.zeros((2, 3)), [[0, 1, 2], [0, 0, 2]]), "permutation"),
        (lambda: D.permutation_average(np.zeros((2, 3)), [[0, 1, 2]]), "perms"),
        (lambda: D.rotations(0), "n must be"),
        (lambda: D.rotated_position(3, 0, 3), "index"),
    ],
)
def test_bad_input_raises_a_clear_value_error(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_ranking_is_by_probability_with_stable_ties() -> None:
    assert D.ranking([0.1, 0.5, 0.1, 0.3]) == [1, 3, 0, 2]
    assert D.ranking(np.full(3, 1 / 3)) == [0, 1, 2]
