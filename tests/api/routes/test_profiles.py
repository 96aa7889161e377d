"""Profile routes: list, detail with versions, rollback, delete; their effect on retrieval."""

from __future__ import annotations

import numpy as np

from tests.api.helpers import retrieve_body


def test_list_and_detail(client, calibrate_json):
    assert client.get("/v1/profiles").json() == {"model": "tiny-qwen2_5_vl", "profiles": []}
    client.post("/v1/calibrate", json=calibrate_json)
    client.post("/v1/calibrate", json=calibrate_json)
    client.post("/v1/calibrate", json={**calibrate_json, "profile": "night-shift"})
    client.post("/v1/calibrate", json={**calibrate_json, "labels": "lower"})
    listed = client.get("/v1/profiles").json()["profiles"]
    assert [p["name"] for p in listed] == ["default", "night-shift"]
    default = {(e["labels"], e["n"]): e for e in listed[0]["entries"]}
    assert set(default) == {("digits", 3), ("lower", 3)}
    assert default["digits", 3]["current_version"] == 2
    assert default["digits", 3]["compatible"] is True

    detail = client.get("/v1/profiles/default").json()
    entry = next(e for e in detail["entries"] if e["labels"] == "digits")
    assert [v["version"] for v in entry["versions"]] == [1, 2]
    assert [v["current"] for v in entry["versions"]] == [False, True]
    assert all(v["num_examples"] == 5 for v in entry["versions"])


def test_rollback_changes_the_version_served(client, items, calibrate_json):
    first = client.post("/v1/calibrate", json=calibrate_json).json()
    fewer = {**calibrate_json, "examples": calibrate_json["examples"][:2]}
    second = client.post("/v1/calibrate", json=fewer).json()
    assert (first["version"], second["version"]) == (1, 2)
    assert not np.allclose(first["bias_matrix"], second["bias_matrix"])
    body = retrieve_body(items[0])
    assert client.post("/v1/retrieve", json=body).json()["profile"]["version"] == 2

    r = client.post("/v1/profiles/default/rollback", params={"n": 3})
    assert r.status_code == 200
    assert r.json() == {
        "name": "default",
        "labels": "digits",
        "n": 3,
        "version": 1,
        "previous_version": 2,
    }
    assert client.post("/v1/retrieve", json=body).json()["profile"]["version"] == 1
    r = client.post("/v1/profiles/default/rollback", params={"n": 3})
    assert r.status_code == 409 and r.json()["error"]["code"] == "no_previous_version"
    r = client.post("/v1/profiles/default/rollback", params={"n": 3, "version": 2})
    assert r.status_code == 200 and r.json()["version"] == 2


def test_delete(client, items, calibrate_json):
    client.post("/v1/calibrate", json=calibrate_json)
    client.post("/v1/calibrate", json={**calibrate_json, "labels": "upper"})
    r = client.delete("/v1/profiles/default", params={"n": 3, "labels": "upper"})
    assert r.status_code == 200
    assert r.json() == {"name": "default", "labels": "upper", "n": 3, "deleted": True}
    r = client.delete("/v1/profiles/default", params={"n": 3, "labels": "upper"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "profile_not_found"
    assert client.post("/v1/retrieve", json=retrieve_body(items[0])).status_code == 200
    assert client.delete("/v1/profiles/default", params={"n": 3}).status_code == 200
    assert client.post("/v1/retrieve", json=retrieve_body(items[0])).status_code == 409
    assert client.get("/v1/profiles/default").status_code == 404
    # a new calibration continues after the highest version ever given (no reuse)
    assert client.post("/v1/calibrate", json=calibrate_json).json()["version"] == 2


def test_query_parameter_errors(client, calibrate_json):
    client.post("/v1/calibrate", json=calibrate_json)
    assert client.delete("/v1/profiles/default").status_code == 422  # n is required
    r = client.delete("/v1/profiles/default", params={"n": 0})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
    r = client.post("/v1/profiles/default/rollback", params={"n": 3, "labels": "klingon"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
    r = client.post("/v1/profiles/default/rollback", params={"n": 3, "labels": "[1, 2, 3]"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_labels"
    r = client.post("/v1/profiles/default/rollback", params={"n": 4})
    assert r.status_code == 404
    custom = client.post("/v1/calibrate", json={**calibrate_json, "labels": ["x", "y", "z"]})
    scheme = custom.json()["labels"]
    assert scheme.startswith("custom:")
    r = client.delete("/v1/profiles/default", params={"n": 3, "labels": "x,y,z"})
    assert r.status_code == 200 and r.json()["labels"] == scheme
