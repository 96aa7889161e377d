"""The sink guard through the service (DESIGN §2.4): /v1/calibrate names the layers whose
prior starves a position, the profile stores them, and agd leaves them out of L* unless
LAD_SINK_GUARD is off (then the answer is exactly the reference math)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from app.engine.interface import ForwardResult, RetrievalItem
from app.method import debias
from tests.api.helpers import retrieve_body


class SinkRunner:
    """A runner with one layer of Λ (``layer``, an index into Λ; the first by default)
    turned into a sink: all of its image attention goes to the first image (plus more mass
    than any other layer)."""

    def __init__(self, runner: Any, layer: int = 0) -> None:
        self._runner = runner
        self._layer = layer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)

    def forward(self, items: Sequence[RetrievalItem], labels: Any = "digits") -> ForwardResult:
        out = self._runner.forward(items, labels)
        attention = []
        for a in out.attention:
            a = a.copy()
            a[self._layer] = 0.0
            a[self._layer, 0] = 10.0
            attention.append(a)
        return ForwardResult(out.scores, attention, out.timings_ms)


def test_calibration_names_sink_layers_and_agd_skips_them(
    make_client, runner, items, calibrate_json
) -> None:
    sink = SinkRunner(runner)
    results = {}
    for guard in (True, False):
        client = make_client(runner_override=sink, sink_guard=guard)
        cal = client.post("/v1/calibrate", json=calibrate_json)
        assert cal.status_code == 200, cal.text
        summary = cal.json()
        assert summary["sink_layers"] == [runner.layers[0]]
        assert summary["hyperparameters"]["sink_guard"] is guard
        stored = client.get("/v1/profiles/default").json()
        assert stored  # listed; the response above read sink_layers back from the stored profile
        body = client.post("/v1/retrieve", json=retrieve_body(items[2], return_details=True))
        results[guard] = (summary, body.json())
    for guard, (summary, body) in results.items():
        a = np.asarray(body["details"]["attention"])
        prior = np.asarray(summary["attention_prior"])
        mask = debias.allowed_layers(prior) if guard else None
        expected = debias.attention_posterior(a, prior, layer_mask=mask)
        np.testing.assert_allclose(body["posterior"], expected, atol=1e-9)
    guarded = np.asarray(results[True][1]["posterior"])
    reference = np.asarray(results[False][1]["posterior"])
    assert not np.allclose(guarded, reference)
