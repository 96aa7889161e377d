"""``lad eval --url``: the harness on a running service (the demo model behind the app, over
HTTP through the client) gives the in-process results on the same seeds."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from calibration_store import open_store
from lad_client import LadClient
from lad_lab.eval.harness import EvalConfig, run_evaluation
from lad_lab.eval.records import read_records
from lad_lab.eval.remote import RemoteBackend

METHODS = ["vanilla", "pride", "attn_raw", "attn_pure", "agd", "perm_avg"]


def _config(out) -> EvalConfig:
    return EvalConfig(
        out=out,
        ns=[3],
        items=4,
        orderings=3,
        calibration=2,
        progress=False,
        bootstrap=200,
        methods=METHODS,
        settings=["adversarial"],
    )


@pytest.mark.slow
def test_url_equals_in_process_on_the_same_seeds(tmp_path, shared_runner) -> None:
    torch.set_num_threads(1)
    run_evaluation(shared_runner("demo"), _config(tmp_path / "local"))
    settings = Settings(_env_file=None, store_url="memory://")
    app = create_app(settings, store=open_store("memory://"))
    with TestClient(app) as http:
        backend = RemoteBackend(LadClient(http=http), concurrency=3)
        run_evaluation(backend, _config(tmp_path / "remote"))
        assert backend.model_id == "demo"
    local = read_records(tmp_path / "local" / "predictions.jsonl")
    remote = read_records(tmp_path / "remote" / "predictions.jsonl")
    assert len(local) == len(remote) == len(METHODS) * 4 * 3
    for a, b in zip(local, remote, strict=True):
        assert (a["item"], a["ordering"], a["method"]) == (b["item"], b["ordering"], b["method"])
        assert a["order"] == b["order"] and a["predicted_position"] == b["predicted_position"]
        np.testing.assert_allclose(a["probabilities"], b["probabilities"], atol=1e-4)
    cal = json.loads((tmp_path / "remote" / "calibration.json").read_text())["runs"]
    service = cal["adversarial_n3"]["service"]  # the service's own /v1/calibrate
    mine = json.loads((tmp_path / "local" / "metrics.json").read_text())["runs"][0]
    np.testing.assert_allclose(
        service["bias_matrix"], mine["calibration"]["bias_matrix"], atol=1e-4
    )
    ours = json.loads((tmp_path / "local" / "metrics.json").read_text())["runs"][0]["methods"]
    theirs = json.loads((tmp_path / "remote" / "metrics.json").read_text())["runs"][0]["methods"]
    for m in METHODS:
        assert ours[m]["acc"] == theirs[m]["acc"] and ours[m]["cons"] == theirs[m]["cons"]
