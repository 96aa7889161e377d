"""The one method dispatch: each name applies the §2.4–§2.5 equations of ``debias``,
per instance and per batch alike, and the wire schemas offer exactly these names."""

from __future__ import annotations

import numpy as np
import pytest

from app.method import debias
from app.method.calibrate import Calibration
from app.method.methods import (
    METHODS,
    MULTI_PASS,
    NEEDS_CALIBRATION,
    MethodConfig,
    apply_method,
    passes,
)

N, LAYERS, B = 4, 3, 6


@pytest.fixture
def evidence() -> tuple[np.ndarray, np.ndarray, Calibration]:
    rng = np.random.default_rng(3)
    scores = np.log(debias.softmax(rng.normal(size=(B, N))))
    attention = rng.random(size=(B, LAYERS, N))
    calibration = Calibration(rng.normal(size=(N, N)), rng.random(size=(LAYERS, N)) + 0.1)
    return scores, attention, calibration


def test_each_method_is_its_equation(evidence) -> None:
    s, a, cal = evidence
    config = MethodConfig(top_k=2, tau=3.0)
    pi = debias.attention_posterior(a, cal.attention_prior, top_k=2, tau=3.0)
    expected = {
        "vanilla": debias.softmax(s),
        "pride": debias.softmax(debias.pride_scores(s, cal.bias_matrix)),
        "attn_pure": pi,
        "agd": debias.softmax(debias.debias_scores(s, cal.bias_matrix, pi)),
    }
    for method, probabilities in expected.items():
        out = apply_method(method, s, a, cal, config)
        np.testing.assert_allclose(out.probabilities, probabilities, atol=1e-12)
        np.testing.assert_allclose(out.probabilities.sum(-1), 1.0, atol=1e-12)
    raw = apply_method("attn_raw", s, a, None, config).probabilities
    readout = debias.raw_attention_readout(a, top_k=2)
    np.testing.assert_array_equal(raw.argmax(-1), readout.argmax(-1))


def test_variants_reach_the_math(evidence) -> None:
    s, a, cal = evidence
    base = apply_method("agd", s, a, cal).probabilities
    for config in (MethodConfig(posterior_variant="logmean"), MethodConfig(mixture="log")):
        other = apply_method("agd", s, a, cal, config).probabilities
        assert not np.allclose(base, other)


def test_batch_equals_one_instance_at_a_time(evidence) -> None:
    s, a, cal = evidence
    for method in set(METHODS) - MULTI_PASS:
        batch = apply_method(method, s, a, cal).probabilities
        single = np.stack([apply_method(method, s[i], a[i], cal).probabilities for i in range(B)])
        np.testing.assert_allclose(batch, single, atol=1e-12)


def test_perm_avg_maps_rotations_back_to_images() -> None:
    rng = np.random.default_rng(0)
    by_image = rng.normal(size=N)  # a model without any position effect
    rotated = np.array([[by_image[p] for p in perm] for perm in debias.rotations(N)])
    out = apply_method("perm_avg", rotated[0], None, rotated_scores=rotated)
    np.testing.assert_allclose(out.debiased_scores, by_image, atol=1e-12)
    batch = apply_method("perm_avg", rotated[None, 0], None, rotated_scores=rotated[None])
    np.testing.assert_allclose(batch.probabilities[0], out.probabilities)
    assert passes("perm_avg", N) == N and passes("agd", N) == 1


def test_missing_inputs_are_errors(evidence) -> None:
    s, a, _ = evidence
    for method in NEEDS_CALIBRATION:
        with pytest.raises(ValueError, match="needs a calibration"):
            apply_method(method, s, a, None)
    with pytest.raises(ValueError, match="rotations"):
        apply_method("perm_avg", s, a)
    with pytest.raises(ValueError, match="unknown method"):
        apply_method("agd_magic", s, a)


def test_the_wire_offers_exactly_the_engine_methods() -> None:
    from app.api.openapi import form_schema
    from lad_client.types import RetrieveOptions, RetrieveRequest

    enum = RetrieveOptions.model_json_schema()["properties"]["method"]["enum"]
    assert tuple(enum) == METHODS
    form = form_schema(RetrieveRequest, "images")
    assert tuple(form["properties"]["method"]["enum"]) == METHODS
