"""Layer selection, per-layer priors and the sink guard end to end, on a tiny Qwen2.5-VL deep
enough that |Λ| > K (12 decoder layers, Λ = 7..11, K = 2; native SDPA capture): calibrate,
then retrieve through the service, and the answers equal the reference math of
app/method/debias.py, with L* chosen per instance from Λ."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from app.method import debias
from lad_lab.testing.tiny_models import DEEP_LAYERS, tiny_runner
from tests.api.helpers import retrieve_body
from tests.api.test_sink_guard import SinkRunner

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def deep() -> Any:
    return tiny_runner("qwen2_5_vl", seed=5, num_hidden_layers=DEEP_LAYERS)


def _reference(body: dict, cal: dict, mask: np.ndarray | None) -> tuple[np.ndarray, ...]:
    """(L*, π, probabilities) of agd from the response's own evidence, by the reference math."""
    s = np.asarray(body["details"]["scores"])
    a = np.asarray(body["details"]["attention"])
    prior, bias = np.asarray(cal["attention_prior"]), np.asarray(cal["bias_matrix"])
    chosen = debias.select_layers(a, 2, layer_mask=mask)
    posterior = debias.attention_posterior(a, prior, top_k=2, tau=5.0, layer_mask=mask)
    return chosen, posterior, debias.softmax(debias.debias_scores(s, bias, posterior))


def test_layer_selection_runs_per_instance_and_equals_the_reference(
    make_client: Any, deep: Any, items: list, calibrate_json: dict
) -> None:
    assert deep.layers == (7, 8, 9, 10, 11)
    client = make_client(runner_override=deep)
    cal = client.post("/v1/calibrate", json=calibrate_json).json()
    prior = np.asarray(cal["attention_prior"])
    assert cal["layers"] == list(deep.layers) and prior.shape == (5, 3)  # one row per layer
    assert cal["sink_layers"] == [] and prior.min() > debias.SINK_THRESHOLD
    chosen_sets = set()
    for item in items:
        body = client.post("/v1/retrieve", json=retrieve_body(item, return_details=True)).json()
        assert body["method"] == "agd" and body["details"]["layers"] == list(deep.layers)
        chosen, posterior, probabilities = _reference(body, cal, debias.allowed_layers(prior))
        assert len(chosen) == 2 and set(chosen) <= set(range(5))
        chosen_sets.add(frozenset(int(k) for k in chosen))
        np.testing.assert_allclose(body["posterior"], posterior, atol=1e-9, rtol=0)
        np.testing.assert_allclose(body["probabilities"], probabilities, atol=1e-9, rtol=0)
    assert len(chosen_sets) > 1, "L* must follow each instance's evidence, not be fixed"


def test_the_sink_guard_takes_another_layer_of_lambda(
    make_client: Any, deep: Any, items: list, calibrate_json: dict
) -> None:
    """Λ[2] (layer 9) sends all its image attention to the first image: its prior starves
    the other positions. Guarded, L* is two of the other four layers; unguarded, it always
    holds layer 9 (the most image mass) and the answer is exactly the reference."""
    sink = SinkRunner(deep, layer=2)
    for guard in (True, False):
        client = make_client(runner_override=sink, sink_guard=guard)
        cal = client.post("/v1/calibrate", json=calibrate_json).json()
        assert cal["sink_layers"] == [9]
        prior = np.asarray(cal["attention_prior"])
        assert prior[2, 1:].max() < debias.SINK_THRESHOLD <= prior[[0, 1, 3, 4]].min()
        mask = debias.allowed_layers(prior) if guard else None
        for item in items[:4]:
            body = client.post("/v1/retrieve", json=retrieve_body(item, return_details=True)).json()
            chosen, posterior, probabilities = _reference(body, cal, mask)
            assert (2 in chosen) is not guard and len(chosen) == 2
            np.testing.assert_allclose(body["posterior"], posterior, atol=1e-9, rtol=0)
            np.testing.assert_allclose(body["probabilities"], probabilities, atol=1e-9, rtol=0)
