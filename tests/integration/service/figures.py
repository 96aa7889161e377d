"""The trace figures of tests/integration/service/test_request_trace.py, printed: per
request on the tiny Qwen, the calls of ``resolve_labels`` and the project files crossed.

``OMP_NUM_THREADS=1 python -m tests.integration.service.figures`` (from the repository
root, ``clients/python`` on the path).
"""

from __future__ import annotations

from typing import Any

import torch
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from calibration_store import open_store
from lad_lab.demo.world import make_items
from lad_lab.testing.tiny_models import tiny_runner
from tests.api.helpers import calibration_body, retrieve_body
from tests.integration.service.tracing import Trace, traced


def _show(trace: Trace, what: str, response: Any) -> None:
    assert response.status_code == 200, response.text
    print(f"{what}: label resolutions {trace.label_resolutions}, files {len(trace.files)}")


def main() -> None:
    torch.set_num_threads(1)
    runner = tiny_runner("qwen2_5_vl")
    items = make_items(3, n_candidates=3, setting="random", seed="eval", image_size=56)
    cal = make_items(5, n_candidates=3, setting="random", seed="calibration", image_size=56)
    with traced() as trace:
        settings = Settings(_env_file=None, store_url="memory://")
        app = create_app(settings, runner=runner, store=open_store("memory://"))
        with TestClient(app) as client:
            with trace.record():
                done = client.post("/v1/calibrate", json=calibration_body(cal))
            _show(trace, "calibrate N=3 (first)", done)
            client.post("/v1/retrieve", json=retrieve_body(items[1]))  # warm
            with trace.record():
                answer = client.post("/v1/retrieve", json=retrieve_body(items[0], method="agd"))
            _show(trace, "retrieve agd N=3", answer)
            with trace.record():
                done = client.post("/v1/calibrate", json=calibration_body(cal, n=[2, 3]))
            _show(trace, "calibrate n=[2,3]", done)
            documents = [d for it in items for d in retrieve_body(it)["images"]][:7]
            body = {"query": items[0].query, "documents": documents, "method": "agd"}
            with trace.record():
                answer = client.post("/v1/rerank", json={**body, "window": 3, "seed": 1})
            _show(trace, f"rerank agd 7 docs {answer.json()['meta']['windows']}", answer)


if __name__ == "__main__":
    main()
