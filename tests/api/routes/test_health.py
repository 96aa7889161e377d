"""Health, readiness, OpenAPI and the Prometheus metrics of one app."""

from __future__ import annotations

import re

import pytest

from tests.api.helpers import metric_value, retrieve_body


def test_health_and_readiness(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    body = ready.json()
    assert body["ready"] is True
    assert body["model"]["model_id"] == "tiny-qwen2_5_vl" and body["model"]["worker_running"]
    assert body["store"]["backend"] == "memory" and body["store"]["status"] == "ok"
    assert body["status"] == "ok"
    assert body["queue"]["depth"] == 0


def test_not_ready_outside_the_lifespan(runner):
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import Settings

    app = create_app(Settings(_env_file=None, store_url="memory://"), runner=runner)
    client = TestClient(app)  # no `with`: the lifespan (model, worker) never started
    r = client.get("/readyz")
    assert r.status_code == 503 and r.json()["ready"] is False
    r = client.post("/v1/retrieve", json={"query": "x", "images": ["a", "b"]})
    assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"
    assert client.get("/healthz").status_code == 200


def test_openapi_documents_both_encodings(client):
    spec = client.get("/openapi.json").json()
    content = spec["paths"]["/v1/retrieve"]["post"]["requestBody"]["content"]
    assert {"application/json", "multipart/form-data"} <= set(content)
    assert {
        "/v1/calibrate",
        "/v1/profiles",
        "/v1/profiles/{name}",
        "/v1/profiles/{name}/rollback",
        "/healthz",
        "/readyz",
        "/metrics",
    } <= set(spec["paths"])
    assert client.get("/docs").status_code == 200


def test_metrics_count_requests_stages_and_calibrations(client, items, calibrate_json):
    client.post("/v1/retrieve", json=retrieve_body(items[0]))  # 409
    client.post("/v1/calibrate", json=calibrate_json)
    for i in range(3):
        client.post("/v1/retrieve", json=retrieve_body(items[i]))
    client.post("/v1/retrieve", json=retrieve_body(items[0], method="vanilla"))
    client.get("/v1/profiles/default")
    text = client.get("/metrics").text

    def value(name: str, **labels: str) -> float | None:
        return metric_value(text, name, **labels)

    post = {"route": "/v1/retrieve", "http_method": "POST"}
    assert value("lad_requests_total", **post, status="200") == 4
    assert value("lad_requests_total", **post, status="409") == 1
    assert value("lad_requests_total", route="/v1/calibrate", http_method="POST", status="200") == 1
    assert (
        value("lad_requests_total", route="/v1/profiles/{name}", http_method="GET", status="200")
        == 1
    )
    # the latency histogram carries the retrieval method (the 409 was an agd request)
    assert value("lad_request_duration_seconds_count", **post, method="agd") == 4
    assert value("lad_request_duration_seconds_count", **post, method="vanilla") == 1
    assert (
        value(
            "lad_request_duration_seconds_count",
            route="/v1/calibrate",
            http_method="POST",
            method="",
        )
        == 1
    )
    for stage in ("decode", "queue", "forward", "score", "debias", "encode"):
        assert value("lad_stage_duration_seconds_count", stage=stage, method="agd") == 3, stage
        assert value("lad_stage_duration_seconds_count", stage=stage, method="vanilla") == 1
    assert value("lad_debias_overhead_ratio_count", method="agd") == 3
    # calibration: 15 rotated instances in waves of max_batch_size=8; then 4 single requests
    assert value("lad_batch_size_count") == 2 + 4
    assert value("lad_batch_size_sum") == 15 + 4
    assert value("lad_queue_depth") == 0
    assert value("lad_queue_capacity") == 64
    assert value("lad_requests_in_flight") == 0
    assert value("lad_calibrations_total", outcome="success") == 1
    assert value("lad_calibrations_total", outcome="invalid") == 0
    assert value("lad_calibration_duration_seconds_count") == 1
    assert value("lad_errors_total", code="calibration_required") == 1
    assert value("lad_errors_total", code="overloaded") == 0  # pre-created
    assert value("lad_store_degraded") == 0
    assert value("lad_profile_version", profile="default", labels="digits", n="3") == 1
    created = value(
        "lad_profile_created_timestamp_seconds", profile="default", labels="digits", n="3"
    )
    assert created is not None and created > 1.7e9
    shares = [
        value(
            "lad_profile_calibration_position_share",
            profile="default",
            labels="digits",
            n="3",
            position=str(p),
        )
        for p in range(3)
    ]
    assert None not in shares and abs(sum(shares) - 1) < 1e-9
    served = {"profile": "default", "labels": "digits", "n": "3"}
    raw = sum(
        value("lad_predicted_position_total", method="agd", position=str(p), kind="raw", **served)
        or 0
        for p in range(3)
    )
    debiased = sum(
        value(
            "lad_predicted_position_total", method="agd", position=str(p), kind="debiased", **served
        )
        or 0
        for p in range(3)
    )
    assert raw == debiased == 3
    unserved = {"profile": "", "labels": "", "n": "3"}
    assert (
        sum(
            value(
                "lad_predicted_position_total",
                method="vanilla",
                position=str(p),
                kind="raw",
                **unserved,
            )
            or 0
            for p in range(3)
        )
        == 1
    )
    assert (
        value("lad_predicted_position_total", method="vanilla", position="0", kind="debiased")
        is None
    )
    assert value("lad_request_images_sum", method="agd") == 9
    tokens = value("lad_prompt_tokens_count", method="agd")
    assert tokens == 3 and value("lad_prompt_tokens_sum", method="agd") > 3 * 12
    assert value("lad_fallback_total", method="agd", n="3") == 0  # pre-created, not used
    assert value("lad_model_info", model_id="tiny-qwen2_5_vl", dtype="float32", device="cpu") == 1
    assert value("lad_requests_total", route="unmatched", http_method="GET", status="404") is None
    assert not re.search(r"^lad_\w+_created[{ ]", text, flags=re.M)  # no _created series


def test_fallback_answers_are_counted_as_fallback(make_client, items):
    client = make_client(fallback_to_vanilla=True)
    body = client.post("/v1/retrieve", json=retrieve_body(items[0], method="pride")).json()
    assert body["method"] == "vanilla" and body["debiased"] is False
    text = client.get("/metrics").text
    assert metric_value(text, "lad_fallback_total", method="pride", n="3") == 1
    assert metric_value(text, "lad_fallback_total", method="agd", n="3") == 0
    assert metric_value(text, "lad_fallback_total", method="agd", n="12") == 0  # to max_images
    assert (
        metric_value(
            text,
            "lad_request_duration_seconds_count",
            route="/v1/retrieve",
            http_method="POST",
            method="vanilla",
        )
        == 1
    )


def test_invalid_calibration_is_counted(client, calibrate_json):
    bad = {**calibrate_json, "examples": [{**calibrate_json["examples"][0], "answer": 7}]}
    assert client.post("/v1/calibrate", json=bad).status_code == 422
    text = client.get("/metrics").text
    assert metric_value(text, "lad_calibrations_total", outcome="invalid") == 1
    assert metric_value(text, "lad_calibrations_total", outcome="success") == 0


def test_unmatched_routes_do_not_explode_label_cardinality(client):
    for i in range(3):
        client.get(f"/random/{i}")
    text = client.get("/metrics").text
    assert (
        metric_value(text, "lad_requests_total", route="unmatched", http_method="GET", status="404")
        == 3
    )
    assert metric_value(text, "lad_errors_total", code="not_found") == 3


def test_two_apps_in_one_process_keep_separate_metrics(make_client, items):
    a, b = make_client(), make_client()
    a.post("/v1/retrieve", json=retrieve_body(items[0], method="vanilla"))
    ta, tb = a.get("/metrics").text, b.get("/metrics").text
    labels = {"route": "/v1/retrieve", "http_method": "POST", "status": "200"}
    assert metric_value(ta, "lad_requests_total", **labels) == 1
    assert metric_value(tb, "lad_requests_total", **labels) is None


@pytest.mark.parametrize("operation", ["put"])
def test_store_errors_answer_503_and_are_counted(make_client, calibrate_json, tmp_path, operation):
    """A file store whose directory vanished (replaced by a file) cannot write: 503 + metric."""
    import shutil

    from calibration_store import open_store

    root = tmp_path / "profiles"
    store = open_store(str(root))
    client = make_client(store=store, store_url=str(root))
    shutil.rmtree(root)
    root.write_text("not a directory")
    r = client.post("/v1/calibrate", json=calibrate_json)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "store_unavailable"
    text = client.get("/metrics").text
    assert metric_value(text, "lad_store_errors_total", operation=operation) == 1
    assert metric_value(text, "lad_calibrations_total", outcome="error") == 1


def test_openapi_tells_the_truth_about_limits_and_errors(make_client):
    client = make_client(max_images=5, max_query_chars=300, max_label_chars=9)
    spec = client.get("/openapi.json").json()
    retrieve = spec["paths"]["/v1/retrieve"]["post"]
    body = retrieve["requestBody"]["content"]["application/json"]["schema"]
    images = body["properties"]["images"]
    assert (images["minItems"], images["maxItems"]) == (2, 5)
    assert body["properties"]["query"]["maxLength"] == 300
    scheme, custom = body["properties"]["labels"]["anyOf"]
    assert scheme["enum"] == ["digits", "upper", "lower", "roman", "words"]
    assert custom["maxItems"] == 5 and custom["items"]["maxLength"] == 9
    form = retrieve["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert (
        form["properties"]["images"]["maxItems"] == 5 and "pattern" in form["properties"]["labels"]
    )
    example = spec["components"]["schemas"]["CalibrationExample"]
    assert example["properties"]["answer"]["maximum"] == 4
    codes = {status: text["description"] for status, text in retrieve["responses"].items()}
    for status, code in [
        ("400", "invalid_image"),
        ("413", "payload_too_large"),
        ("415", "unsupported_image_format"),
        ("422", "too_many_images"),
        ("408", "request_timeout"),
        ("429", "overloaded"),
        ("409", "calibration_required"),
        ("503", "not_ready"),
    ]:
        assert f"`{code}`" in codes[status], (status, code)
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            expected = {"413", "500"} | ({"422", "503"} if path.startswith("/v1/") else set())
            assert expected <= set(operation["responses"]), (method, path)
    delete = spec["paths"]["/v1/profiles/{name}"]["delete"]
    n = next(p for p in delete["parameters"] if p["name"] == "n")
    assert (n["schema"]["minimum"], n["schema"]["maximum"]) == (2, 64)
    labels = next(p for p in delete["parameters"] if p["name"] == "labels")
    assert labels["schema"]["maxLength"] < 3000 and "pattern" in labels["schema"]
    assert "`store_unavailable`" in delete["responses"]["503"]["description"]
    error = spec["components"]["schemas"]["ErrorDetail"]
    assert set(error["required"]) == {"code", "message", "request_id"}


def test_readiness_shows_no_paths_or_error_strings(make_client, tmp_path):
    from calibration_store import open_store

    root = tmp_path / "secret-profile-dir"
    client = make_client(store=open_store(str(root)), store_url=str(root))
    body = client.get("/readyz").json()
    assert body["store"] == {"backend": "file", "profiles": 0, "status": "ok", "writes": "ok"}
    assert str(tmp_path) not in client.get("/readyz").text
