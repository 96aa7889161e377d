"""POST /v1/calibrate with `n`: every N from one set of examples (design §2.9), all or none."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from app.method.calibrate import calibration_instances, example_of_size
from calibration_store import StoreUnavailable, open_store
from lad_lab.demo.world import RetrievalExample, make_items
from tests.api.helpers import calibration_body, retrieve_body


@pytest.fixture(scope="module")
def wide_items() -> list[RetrievalExample]:
    return make_items(3, n_candidates=5, setting="random", seed="calibration", image_size=56)


def test_every_n_from_one_calibration(
    client: Any, wide_items: list[RetrievalExample], items: list[RetrievalExample]
) -> None:
    body = calibration_body(wide_items, n="all", seed=3)
    r = client.post("/v1/calibrate", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert [e["n"] for e in out["per_n"]] == [2, 3, 4, 5]
    assert [e["forward_passes"] for e in out["per_n"]] == [3 * n for n in (2, 3, 4, 5)]
    assert out["forward_passes"] == 3 * (2 + 3 + 4 + 5) and out["n"] == 5
    assert all(e["version"] == 1 for e in out["per_n"])
    assert all(np.asarray(e["bias_matrix"]).shape == (e["n"], e["n"]) for e in out["per_n"])
    entries = client.get("/v1/profiles/default").json()["entries"]
    assert sorted(e["n"] for e in entries) == [2, 3, 4, 5]
    # a profile for N is usable on its own: retrieval at N = 3 finds it
    answer = client.post("/v1/retrieve", json=retrieve_body(items[0])).json()
    assert answer["profile"] == {"name": "default", "version": 1} and answer["debiased"]
    again = client.post("/v1/calibrate", json={**body, "n": [3, 5]}).json()
    assert [(e["n"], e["version"]) for e in again["per_n"]] == [(3, 2), (5, 2)]


def test_the_largest_n_equals_a_plain_calibration(
    client: Any, wide_items: list[RetrievalExample]
) -> None:
    """N = C keeps every candidate: the same B as calibrating the examples as they are."""
    many = client.post("/v1/calibrate", json=calibration_body(wide_items, n=[2, 5])).json()
    plain = client.post("/v1/calibrate", json=calibration_body(wide_items, profile="p")).json()
    assert np.allclose(many["per_n"][1]["bias_matrix"], plain["bias_matrix"], atol=1e-6)


def test_bad_n_is_422(client: Any, wide_items: list[RetrievalExample]) -> None:
    for n, code in (
        ([2, 6], "invalid_calibration"),
        ([1], "invalid_request"),
        ("some", "invalid_request"),
        ([], "invalid_request"),
    ):
        r = client.post("/v1/calibrate", json=calibration_body(wide_items, n=n))
        assert r.status_code == 422 and r.json()["error"]["code"] == code, (n, r.text)
    assert client.get("/v1/profiles").json()["profiles"] == []


def test_store_failure_stores_no_n(make_client: Any, wide_items: list[RetrievalExample]) -> None:
    """The last write of the batch fails: no N of it is current (503 store_unavailable)."""

    class FailingOnThird:
        def __init__(self) -> None:
            self.inner = open_store("memory://")

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def put_many(self, profiles: list[Any]) -> list[Any]:
            if len(profiles) > 2:
                raise StoreUnavailable("disk full")
            return self.inner.put_many(profiles)

    store = FailingOnThird()
    client = make_client(store=store)
    r = client.post("/v1/calibrate", json=calibration_body(wide_items, n=[2, 3, 4]))
    assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"
    assert store.inner.list_keys() == []


def test_example_of_size_is_seeded_and_keeps_the_gt() -> None:
    example = ("q", list("abcdefgh"), 5)
    cut = example_of_size(example, 4, seed=1, index=0)
    assert cut == example_of_size(example, 4, seed=1, index=0)
    assert cut[1][cut[2]] == "f" and len(cut[1]) == 4 and cut[1] == sorted(cut[1])
    assert {tuple(example_of_size(example, 4, seed=s)[1]) for s in range(8)} != {tuple(cut[1])}
    assert example_of_size(example, 8, seed=1) == example
    instances, gt = calibration_instances([cut])
    assert sorted(gt.tolist()) == [0, 1, 2, 3]
    assert all(images[t] == "f" for (_, images), t in zip(instances, gt, strict=True))


def test_every_n_profile_keeps_its_online_record(
    make_client: Any, wide_items: list[RetrievalExample]
) -> None:
    """Each N's profile carries its own offline sums (M instances per GT row), provenance and
    diagnostics, so online refresh works on it like on a one-N calibration."""
    store = open_store("memory://")
    client = make_client(store=store)
    out = client.post("/v1/calibrate", json=calibration_body(wide_items, n=[2, 4])).json()
    assert out["diagnostics"] is not None
    for key in store.list_keys():
        profile = store.get(key)
        stats = profile.calibration_statistics
        assert stats["row_counts"] == [len(wide_items)] * key.n
        assert profile.provenance == {"source": "offline", "offline_examples": len(wide_items)}
        assert profile.hyperparameters["negatives_seed"] == 0
