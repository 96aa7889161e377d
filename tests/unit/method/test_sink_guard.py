"""The sink guard (DESIGN §2.4) and the no-prior ablation: a layer whose prior starves a
position stays out of L*; with the guard off, and without sink layers, the math is exactly
the reference; κ̂ is the visual gain of the calibration."""

from __future__ import annotations

import numpy as np
import pytest

from app.method import debias
from app.method.calibrate import Calibration, estimate_calibration
from app.method.methods import MethodConfig, apply_method

N = 4


def _case(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Attention (B, 3, N) where layer 0 is a sink (prior ~0 at positions 1..3) with the
    largest image mass, so that without the guard it is always in L*."""
    rng = np.random.default_rng(seed)
    attention = rng.random((6, 3, N)) + 0.05
    attention[:, 0] = [5.0, 1e-9, 1e-9, 1e-9]
    prior = attention.mean(axis=0)
    return rng.normal(size=(6, N)), attention, prior


def test_sink_layers_flag_a_starved_position() -> None:
    prior = np.array([[0.5, 1e-7, 0.2, 0.3], [0.25, 0.25, 0.25, 0.25], [1e-6, 0.5, 0.2, 0.3]])
    assert debias.sink_layers(prior).tolist() == [True, False, False]  # 1e-6 itself is not < 1e-6
    assert debias.allowed_layers(prior).tolist() == [False, True, True]
    all_sinks = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert debias.allowed_layers(all_sinks).tolist() == [True, True]  # nothing better to use


def test_select_layers_respects_the_mask() -> None:
    attention = np.array([[9.0, 9.0], [1.0, 1.0], [2.0, 2.0]])
    assert debias.select_layers(attention, 2).tolist() == [0, 2]
    mask = np.array([False, True, True])
    assert debias.select_layers(attention, 2, mask).tolist() == [2, 1]
    assert debias.select_layers(attention, 5, np.array([False, True, False])).tolist() == [1]
    with pytest.raises(ValueError, match="allows no layer"):
        debias.select_layers(attention, 2, np.zeros(3, bool))
    with pytest.raises(ValueError, match="bool array"):
        debias.select_layers(attention, 2, np.ones(2, bool))


def test_guard_equals_the_reference_without_the_sink_layer() -> None:
    _, attention, prior = _case()
    guarded = debias.attention_posterior(
        attention, prior, top_k=2, layer_mask=debias.allowed_layers(prior)
    )
    without = debias.attention_posterior(attention[:, 1:], prior[1:], top_k=2)
    np.testing.assert_allclose(guarded, without, atol=1e-12)
    reference = debias.attention_posterior(attention, prior, top_k=2)
    assert not np.allclose(guarded, reference)  # the sink layer changes the reference answer


def test_apply_method_guard_on_by_default_and_off_is_the_reference() -> None:
    scores, attention, prior = _case(1)
    b = np.random.default_rng(2).normal(size=(N, N))
    calibration = Calibration(b, prior)
    assert calibration.sink_layers == [0]
    on = apply_method("agd", scores, attention, calibration)
    off = apply_method("agd", scores, attention, calibration, MethodConfig(sink_guard=False))
    pi_ref = debias.attention_posterior(attention, prior, top_k=2)
    np.testing.assert_allclose(off.posterior, pi_ref, atol=1e-12)
    np.testing.assert_allclose(off.debiased_scores, debias.debias_scores(scores, b, pi_ref))
    pi_guard = debias.attention_posterior(attention[:, 1:], prior[1:], top_k=2)
    np.testing.assert_allclose(on.posterior, pi_guard, atol=1e-12)


def test_guard_changes_nothing_without_sink_layers() -> None:
    rng = np.random.default_rng(4)
    attention = rng.random((5, 3, N)) + 0.1
    calibration = Calibration(rng.normal(size=(N, N)), attention.mean(axis=0))
    s = rng.normal(size=(5, N))
    on = apply_method("agd", s, attention, calibration).probabilities
    off = apply_method("agd", s, attention, calibration, MethodConfig(sink_guard=False))
    np.testing.assert_array_equal(on, off.probabilities)


def test_no_prior_is_the_posterior_with_a_prior_of_ones() -> None:
    scores, attention, prior = _case(3)
    calibration = Calibration(np.zeros((N, N)), prior)
    out = apply_method("attn_pure", scores, attention, calibration, MethodConfig(use_prior=False))
    expected = debias.attention_posterior(attention, np.ones_like(prior), top_k=2)
    np.testing.assert_allclose(out.probabilities, expected, atol=1e-12)
    # p̃ = ā without a prior: attn_pure then ranks as attn_raw does
    raw = debias.raw_attention_readout(attention, top_k=2)
    np.testing.assert_array_equal(out.probabilities.argmax(-1), raw.argmax(-1))


def test_kappa_is_the_largest_observed_margin() -> None:
    rng = np.random.default_rng(5)
    scores = rng.normal(size=(8, N))
    gt = np.array([0, 1, 2, 3, 0, 1, 2, 3])
    l_obs = debias.observed_matrix(scores, gt)
    np.testing.assert_allclose(l_obs[2], scores[[2, 6]].mean(axis=0))
    brute = max(l_obs[t, t] - l_obs[t, j] for t in range(N) for j in range(N) if j != t)
    assert debias.visual_gain(l_obs) == pytest.approx(brute)
    calibration = estimate_calibration(scores, rng.random((8, 2, N)), gt)
    assert calibration.kappa == pytest.approx(brute)
    # B = Lobs − I: the diagonal margin of B over its row is Lobs's margin minus κ̂
    b = calibration.bias_matrix
    np.testing.assert_allclose(
        np.diag(b)[:, None] - b,
        np.diag(l_obs)[:, None] - l_obs - brute * (1 - np.eye(N)),
        atol=1e-12,
    )
    assert debias.visual_gain(np.zeros((1, 1))) == 0.0
