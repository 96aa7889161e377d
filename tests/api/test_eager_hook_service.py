"""The service end to end on the eager-hook capture with real depth: a tiny Qwen2.5-VL with
12 decoder layers (Λ = 7..11, so |Λ| = 5 > K = 2) forced onto the fallback capture.
Calibration writes a per-layer prior for every layer of Λ and names a sink layer, agd
picks K of the remaining layers, and a profile of the other capture is refused."""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.attention import EAGER_HOOK_CAPTURE
from app.method import debias
from calibration_store import open_store
from tests.api.helpers import retrieve_body
from tests.api.test_sink_guard import SinkRunner

LAMBDA = [7, 8, 9, 10, 11]


@pytest.fixture(scope="module")
def deep_runner(shared_runner):
    return shared_runner("qwen2_5_vl", num_hidden_layers=12, capture=EAGER_HOOK_CAPTURE)


def test_layer_selection_sink_guard_and_priors_run_end_to_end(
    make_client, deep_runner, items, calibrate_json
) -> None:
    client = make_client(runner_override=SinkRunner(deep_runner))
    cal = client.post("/v1/calibrate", json=calibrate_json)
    assert cal.status_code == 200, cal.text
    summary = cal.json()
    assert summary["layers"] == LAMBDA and summary["sink_layers"] == [7]
    prior = np.asarray(summary["attention_prior"])
    assert prior.shape == (5, 3) and np.all(prior[1:] > 1e-6)
    assert len({tuple(row) for row in prior[1:].round(9)}) == 4  # one prior per layer
    body = client.post("/v1/retrieve", json=retrieve_body(items[1], return_details=True)).json()
    a = np.asarray(body["details"]["attention"])
    assert body["details"]["layers"] == LAMBDA and a.shape == (5, 3)
    mask = debias.allowed_layers(prior)
    chosen = debias.select_layers(a, 2, layer_mask=mask)
    assert len(chosen) == 2 and 0 not in chosen.tolist()  # K of the 4 non-sink layers
    expected = debias.attention_posterior(a, prior, layer_mask=mask)
    np.testing.assert_allclose(body["posterior"], expected, atol=1e-9)


def test_a_profile_of_the_other_capture_is_refused(
    make_client, deep_runner, items, calibrate_json, shared_runner
) -> None:
    store = open_store("memory://")
    sdpa = shared_runner("qwen2_5_vl", num_hidden_layers=12)
    made = make_client(runner_override=sdpa, store=store).post("/v1/calibrate", json=calibrate_json)
    assert made.status_code == 200, made.text
    served = make_client(runner_override=deep_runner, store=store)
    answer = served.post("/v1/retrieve", json=retrieve_body(items[0]))
    assert answer.status_code == 409, answer.text
    assert answer.json()["error"]["code"] == "profile_mismatch"
    assert "capture" in answer.json()["error"]["message"]
