"""The request pipeline's stages seen through HTTP: labels resolved once per request and N,
one calibration path for one N and several N, no store call on the event loop."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from app.engine.labels import Labels
from calibration_store import open_store
from tests.api.helpers import calibration_body, retrieve_body


@pytest.fixture
def resolutions(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, int]]:
    """Every ``Labels.resolve`` call (value, N) while the test runs."""
    calls: list[tuple[Any, int]] = []
    original = Labels.resolve.__func__  # type: ignore[attr-defined]

    def spy(cls: type[Labels], value: Any, n: int) -> Labels:
        calls.append((value, n))
        return original(cls, value, n)

    monkeypatch.setattr(Labels, "resolve", classmethod(spy))
    return calls


@pytest.mark.parametrize("labels", ["digits", ["cat", "dog", "owl"]])
def test_a_retrieve_resolves_its_labels_once(
    make_client, items, calibrate_json, resolutions, labels
) -> None:
    client = make_client()
    done = client.post("/v1/calibrate", json={**calibrate_json, "labels": labels})
    assert done.status_code == 200, done.text
    resolutions.clear()
    answer = client.post(
        "/v1/retrieve", json=retrieve_body(items[0], labels=labels, return_details=True)
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["profile"] is not None  # the profile was found under those labels
    expected = ["1", "2", "3"] if labels == "digits" else labels
    assert answer.json()["details"]["labels"] == expected
    assert resolutions == [(labels, 3)]


def test_a_rerank_resolves_each_window_size_once(make_client, items, resolutions) -> None:
    client = make_client()
    documents = [d for it in items[:3] for d in retrieve_body(it)["images"]][:7]
    answer = client.post(
        "/v1/rerank",
        json={
            "query": items[0].query,
            "documents": documents,
            "method": "vanilla",
            "window": 3,
            "seed": 1,
        },
    )
    assert answer.status_code == 200, answer.text
    sizes = sorted({n for window in answer.json()["meta"]["windows"] for n in window})
    assert sorted(n for _, n in resolutions) == sizes  # once per size, not per window


def test_one_n_is_several_n_with_one_size(make_client, calibrate_json) -> None:
    client = make_client()
    one = client.post("/v1/calibrate", json=calibrate_json).json()
    several = client.post("/v1/calibrate", json={**calibrate_json, "n": [3]}).json()
    assert one["per_n"] is None and several["per_n"][0]["n"] == 3
    assert one["forward_passes"] == several["forward_passes"] == 5 * 3
    assert several["version"] == one["version"] + 1
    np.testing.assert_allclose(one["bias_matrix"], several["bias_matrix"], atol=1e-6)
    np.testing.assert_allclose(one["attention_prior"], several["attention_prior"], atol=1e-6)
    assert "negatives_seed" not in one["hyperparameters"]
    assert several["hyperparameters"]["negatives_seed"] == 0


class LoopCheckingStore:
    """A memory store that records every call made on a thread that runs an event loop."""

    def __init__(self) -> None:
        self.inner = open_store("memory://")
        self.on_loop: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                asyncio.get_running_loop()
                self.on_loop.append(name)
            except RuntimeError:
                pass
            return attr(*args, **kwargs)

        return call


def test_feedback_and_profile_routes_never_read_the_store_on_the_event_loop(
    make_client, items, calibration_items
) -> None:
    store = LoopCheckingStore()
    client = make_client(store=store)  # type: ignore[arg-type]
    assert client.post("/v1/calibrate", json=calibration_body(calibration_items)).status_code == 200
    rid = client.post("/v1/retrieve", json=retrieve_body(items[0])).json()["request_id"]
    store.on_loop.clear()
    fed = client.post("/v1/feedback", json={"request_id": rid, "answer": items[0].target})
    assert fed.status_code == 200 and fed.json()["counted"] is True, fed.text
    assert client.get("/v1/profiles/default").json()["entries"][0]["online"]["feedback"] == 1
    assert client.get("/v1/profiles").status_code == 200
    assert store.on_loop == []
