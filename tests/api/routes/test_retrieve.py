"""POST /v1/retrieve end to end on a real tiny model: encodings, methods, calibration gating."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.method import debias
from calibration_store import Profile, open_store
from tests.api.helpers import data_url, multipart_files, png_bytes, retrieve_body

STAGES = {"decode", "base64", "fetch", "queue", "process", "forward", "score", "debias", "encode"}


def _check_distribution(values: list[float], n: int) -> None:
    assert len(values) == n
    assert all(v >= 0 for v in values)
    assert math.isclose(sum(values), 1.0, abs_tol=1e-6)


def test_uncalibrated_agd_is_409_then_served_after_calibrate(client, items, calibrate_json):
    item = items[0]
    r = client.post("/v1/retrieve", json=retrieve_body(item))
    assert r.status_code == 409
    err = r.json()["error"]
    assert err["code"] == "calibration_required"
    assert "/v1/calibrate" in err["message"] and "N=3" in err["message"]

    cal = client.post("/v1/calibrate", json=calibrate_json)
    assert cal.status_code == 200, cal.text
    summary = cal.json()
    assert summary["version"] == 1 and summary["n"] == 3 and summary["num_examples"] == 5
    assert summary["forward_passes"] == 15
    assert np.asarray(summary["bias_matrix"]).shape == (3, 3)
    assert summary["labels"] == "digits" and summary["profile"] == "default"

    r = client.post("/v1/retrieve", json=retrieve_body(item))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["method"] == "agd" and body["debiased"] is True
    assert body["profile"] == {"name": "default", "version": 1}
    assert body["model"] == "tiny-qwen2_5_vl"
    _check_distribution(body["probabilities"], 3)
    _check_distribution(body["raw_probabilities"], 3)
    _check_distribution(body["posterior"], 3)
    assert body["index"] == int(np.argmax(body["probabilities"]))
    assert body["label"] == str(body["index"] + 1)
    assert set(body["timings_ms"]) == STAGES
    assert all(v >= 0 for v in body["timings_ms"].values())
    # the service's own time, at least what its stages add up to (decode includes base64)
    name, duration = r.headers["server-timing"].split(";")
    stages = sum(v for k, v in body["timings_ms"].items() if k != "base64")  # fetch: 0 here
    assert name == "app" and float(duration.removeprefix("dur=")) >= stages


def test_agd_matches_the_debias_math_on_the_returned_evidence(client, items, calibrate_json):
    """The service's answer is exactly §2.4 applied to its own scores, attention and profile."""
    cal = client.post("/v1/calibrate", json=calibrate_json).json()
    body = client.post("/v1/retrieve", json=retrieve_body(items[1], return_details=True)).json()
    details = body["details"]
    s = np.asarray(details["scores"])
    a = np.asarray(details["attention"])
    posterior = debias.attention_posterior(a, np.asarray(cal["attention_prior"]))
    d = debias.debias_scores(s, np.asarray(cal["bias_matrix"]), posterior)
    np.testing.assert_allclose(body["posterior"], posterior, atol=1e-9)
    np.testing.assert_allclose(details["debiased_scores"], d, atol=1e-9)
    np.testing.assert_allclose(body["probabilities"], debias.softmax(d), atol=1e-9)
    np.testing.assert_allclose(body["raw_probabilities"], np.exp(s), atol=1e-9)
    assert details["layers"] == cal["layers"] and details["labels"] == ["1", "2", "3"]
    assert a.shape == (len(cal["layers"]), 3)


@pytest.mark.parametrize("method", ["vanilla", "pride", "attn_pure", "perm_avg"])
def test_every_method(client, items, calibrate_json, method):
    assert client.post("/v1/calibrate", json=calibrate_json).status_code == 200
    body = client.post("/v1/retrieve", json=retrieve_body(items[2], method=method)).json()
    assert body["method"] == method
    _check_distribution(body["probabilities"], 3)
    assert body["index"] == int(np.argmax(body["probabilities"]))
    assert sorted(body["ranking"]) == [0, 1, 2] and body["ranking"][0] == body["index"]
    ranked = [body["probabilities"][i] for i in body["ranking"]]
    assert ranked == sorted(ranked, reverse=True)
    assert body["debiased"] is (method != "vanilla")
    assert (body["profile"] is not None) is (method in ("pride", "attn_pure"))
    if method == "vanilla":
        assert body["probabilities"] == body["raw_probabilities"]
    if method == "attn_pure":
        assert body["probabilities"] == body["posterior"]


def test_vanilla_and_perm_avg_need_no_calibration(client, items):
    for method in ("vanilla", "perm_avg"):
        r = client.post("/v1/retrieve", json=retrieve_body(items[3], method=method))
        assert r.status_code == 200, r.text
        assert r.json()["profile"] is None


def test_perm_avg_is_invariant_to_the_order_of_images(client, items):
    """perm_avg averages the N cyclic rotations, so a rotated request (the same set of
    orderings) gets the same answer per image; a reversal is another set, only close."""
    item = items[4]
    body = client.post("/v1/retrieve", json=retrieve_body(item, method="perm_avg")).json()
    reordered = retrieve_body(item, method="perm_avg")
    reordered["images"] = reordered["images"][1:] + reordered["images"][:1]
    rotated = client.post("/v1/retrieve", json=reordered).json()  # image i now at i - 1
    np.testing.assert_allclose(
        np.roll(rotated["probabilities"], 1), body["probabilities"], atol=1e-6
    )


def test_multipart_equals_json(client, items, calibrate_json):
    client.post("/v1/calibrate", json=calibrate_json)
    item = items[5]
    as_json = client.post("/v1/retrieve", json=retrieve_body(item)).json()
    r = client.post("/v1/retrieve", data={"query": item.query}, files=multipart_files(item.images))
    assert r.status_code == 200, r.text
    as_form = r.json()
    assert as_form["index"] == as_json["index"]
    np.testing.assert_allclose(as_form["probabilities"], as_json["probabilities"], atol=1e-6)
    r = client.post(
        "/v1/retrieve",
        data={
            "query": item.query,
            "method": "vanilla",
            "labels": "upper",
            "return_details": "true",
        },
        files=multipart_files(item.images),
    )
    assert r.status_code == 200, r.text
    assert r.json()["details"]["labels"] == ["A", "B", "C"] and r.json()["method"] == "vanilla"


def test_data_urls_and_bare_base64_are_equivalent(client, items):
    item = items[6]
    bare = client.post("/v1/retrieve", json=retrieve_body(item, method="vanilla")).json()
    png_urls = [data_url(img, "PNG") for img in item.images]
    r = client.post(
        "/v1/retrieve", json={"query": item.query, "images": png_urls, "method": "vanilla"}
    )
    assert r.status_code == 200
    assert r.json()["probabilities"] == pytest.approx(bare["probabilities"], abs=1e-9)
    jpeg = [data_url(img, "JPEG") for img in item.images]
    r = client.post("/v1/retrieve", json={"query": item.query, "images": jpeg, "method": "vanilla"})
    assert r.status_code == 200


def test_fallback_to_vanilla_when_configured(make_client, items):
    client = make_client(fallback_to_vanilla=True)
    r = client.post("/v1/retrieve", json=retrieve_body(items[0]))
    assert r.status_code == 200
    body = r.json()
    assert body["debiased"] is False and body["method"] == "vanilla" and body["profile"] is None
    assert body["probabilities"] == body["raw_probabilities"]


def test_profile_calibrated_under_another_engine_is_409(make_client, runner, items):
    store = open_store("memory://")
    fp = runner.fingerprint("digits", 3)
    stale = Profile.create(
        name="default",
        fingerprint={**fp.model_dump(), "dtype": "bfloat16", "prompt_hash": "0" * 64},
        layers=list(runner.layers),
        bias_matrix=np.zeros((3, 3)),
        attention_prior=np.full((len(runner.layers), 3), 0.1),
        num_examples=5,
        num_forward_passes=15,
    )
    store.put(stale)
    client = make_client(store=store)
    r = client.post("/v1/retrieve", json=retrieve_body(items[0]))
    assert r.status_code == 409
    err = r.json()["error"]
    assert err["code"] == "profile_mismatch"
    assert "recalibrate" in err["message"]
    # what changed, with both dtypes named (LAD_DTYPE=auto may pick another one on new hardware)
    assert f"dtype: profile 'bfloat16' vs engine '{fp.dtype}'" in err["message"]
    listed = client.get("/v1/profiles/default").json()["entries"][0]
    assert listed["compatible"] is False


def test_profiles_are_per_labels_and_n(client, items, calibrate_json):
    client.post("/v1/calibrate", json=calibrate_json)
    r = client.post("/v1/retrieve", json=retrieve_body(items[0], labels="upper"))
    assert r.status_code == 409  # calibrated for digits only
    r = client.post("/v1/retrieve", json=retrieve_body(items[0], profile="other"))
    assert r.status_code == 409
    upper = client.post("/v1/calibrate", json={**calibrate_json, "labels": ["A", "B", "C"]})
    assert upper.status_code == 200 and upper.json()["labels"] == "upper"
    r = client.post("/v1/retrieve", json=retrieve_body(items[0], labels="upper"))
    assert r.status_code == 200 and r.json()["label"] in "ABC"


def test_images_of_any_format_and_mode_are_accepted(client, items):
    from PIL import Image

    grey = items[0].images[0].convert("L")
    rgba = items[0].images[1].convert("RGBA")
    odd = Image.new("RGB", (80, 40), "red")
    import base64

    images = [base64.b64encode(png_bytes(im)).decode() for im in (grey, rgba, odd)]
    r = client.post(
        "/v1/retrieve", json={"query": "a red thing", "images": images, "method": "vanilla"}
    )
    assert r.status_code == 200, r.text


def test_concurrent_requests_share_batches(make_client, items):
    import concurrent.futures

    client: TestClient = make_client(max_batch_size=4, max_wait_ms=50)
    bodies = [
        retrieve_body(items[i % len(items)], method="vanilla", return_details=True)
        for i in range(8)
    ]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda b: client.post("/v1/retrieve", json=b), bodies))
    assert all(a.status_code == 200 for a in answers)
    assert max(a.json()["details"]["batch_size"] for a in answers) > 1
    # batching does not change answers
    alone = client.post("/v1/retrieve", json=bodies[0]).json()
    np.testing.assert_allclose(
        answers[0].json()["probabilities"], alone["probabilities"], atol=1e-4
    )


@pytest.mark.parametrize(
    ("variant", "mixture", "top_k", "tau"),
    [("logmean", "log", 1, 2.0), ("reference", "log", 2, 5.0)],
)
def test_method_settings_reach_the_math(
    make_client, items, calibrate_json, variant, mixture, top_k, tau
):
    client = make_client(posterior_variant=variant, mixture=mixture, top_k=top_k, tau=tau)
    cal = client.post("/v1/calibrate", json=calibrate_json).json()
    assert cal["hyperparameters"]["posterior_variant"] == variant
    assert cal["hyperparameters"]["mixture"] == mixture
    body = client.post("/v1/retrieve", json=retrieve_body(items[1], return_details=True)).json()
    s = np.asarray(body["details"]["scores"])
    a = np.asarray(body["details"]["attention"])
    posterior = debias.attention_posterior(
        a, np.asarray(cal["attention_prior"]), top_k=top_k, tau=tau, variant=variant
    )
    d = debias.debias_scores(s, np.asarray(cal["bias_matrix"]), posterior, mixture=mixture)
    np.testing.assert_allclose(body["posterior"], posterior, atol=1e-9)
    np.testing.assert_allclose(body["details"]["debiased_scores"], d, atol=1e-9)
