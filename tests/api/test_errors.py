"""Bad input answers a clear 4xx in the common envelope; a failing model answers 500 alone."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from tests.api.helpers import FaultyRunner, b64, calibration_body, multipart_files, retrieve_body


def _error(response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "message", "detail"}
    assert set(body["error"]) == {"code", "message", "type", "request_id"}
    assert body["message"] == body["error"]["message"]  # where Cohere's clients read it
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    assert body["error"]["request_id"] == response.headers["x-request-id"]
    return body["error"]["message"]


def _body(items, **changes):
    return {**retrieve_body(items[0], method="vanilla"), **changes}


def test_bad_base64(client, items):
    images = [b64(im) for im in items[0].images]
    images[1] = "not base64 at all!!!"
    msg = _error(
        client.post("/v1/retrieve", json=_body(items, images=images)), 400, "invalid_image"
    )
    assert "images[1]" in msg


def test_base64_that_is_not_an_image(client, items):
    images = [b64(im) for im in items[0].images]
    images[2] = base64.b64encode(b"hello, I am text and not a picture").decode()
    msg = _error(
        client.post("/v1/retrieve", json=_body(items, images=images)), 400, "invalid_image"
    )
    assert "images[2]" in msg


def test_truncated_image(client, items):
    raw = base64.b64decode(b64(items[0].images[0]))
    images = [b64(im) for im in items[0].images]
    images[0] = base64.b64encode(raw[: len(raw) // 2]).decode()
    _error(client.post("/v1/retrieve", json=_body(items, images=images)), 400, "invalid_image")


def test_data_url_that_is_not_an_image_type(client, items):
    images = [b64(im) for im in items[0].images]
    images[0] = "data:text/plain;base64," + images[0]
    _error(client.post("/v1/retrieve", json=_body(items, images=images)), 400, "invalid_image")


def test_too_many_and_too_few_images(make_client, items):
    client = make_client(max_images=4)
    images = [b64(items[0].images[0])] * 5
    msg = _error(
        client.post("/v1/retrieve", json=_body(items, images=images)), 422, "too_many_images"
    )
    assert "LAD_MAX_IMAGES=4" in msg
    msg = _error(
        client.post("/v1/retrieve", json=_body(items, images=images[:1])), 422, "invalid_request"
    )  # the schema says minItems 2
    assert "images" in msg
    _error(client.post("/v1/retrieve", json=_body(items, images=[])), 422, "invalid_request")


def test_image_too_large_in_bytes_and_pixels(make_client, items):
    client = make_client(max_image_bytes=2000, max_image_pixels=100 * 100)
    noisy = Image.effect_noise((64, 64), 100).convert("RGB")  # incompressible PNG > 2000 B
    images = [b64(items[0].images[0]), b64(noisy), b64(items[0].images[1])]
    msg = _error(
        client.post("/v1/retrieve", json=_body(items, images=images)), 413, "image_too_large"
    )
    assert "LAD_MAX_IMAGE_BYTES" in msg
    big = Image.new("RGB", (200, 200), "white")  # tiny file, 40000 pixels
    images = [b64(items[0].images[0]), b64(big), b64(items[0].images[1])]
    msg = _error(
        client.post("/v1/retrieve", json=_body(items, images=images)), 413, "image_too_large"
    )
    assert "LAD_MAX_IMAGE_PIXELS" in msg
    r = client.post(
        "/v1/retrieve", data={"query": "x"}, files=multipart_files([items[0].images[0], noisy])
    )
    _error(r, 413, "image_too_large")


def test_query_empty_blank_and_too_long(make_client, items):
    client = make_client(max_query_chars=20)
    _error(client.post("/v1/retrieve", json=_body(items, query="")), 422, "invalid_request")
    _error(client.post("/v1/retrieve", json=_body(items, query="   ")), 422, "invalid_query")
    msg = _error(
        client.post("/v1/retrieve", json=_body(items, query="x" * 21)), 422, "invalid_query"
    )
    assert "LAD_MAX_QUERY_CHARS=20" in msg


def test_unknown_method_labels_and_fields(client, items):
    msg = _error(
        client.post("/v1/retrieve", json=_body(items, method="magic")), 422, "invalid_request"
    )
    assert "method" in msg
    _error(client.post("/v1/retrieve", json=_body(items, labels="klingon")), 422, "invalid_labels")
    _error(
        client.post("/v1/retrieve", json=_body(items, labels=["x", "y"])), 422, "invalid_labels"
    )  # 2 labels for N=3
    _error(
        client.post("/v1/retrieve", json=_body(items, labels=["x", "x", "y"])),
        422,
        "invalid_labels",
    )
    msg = _error(
        client.post("/v1/retrieve", json=_body(items, labels=["<|im_end|>", "b", "c"])),
        422,
        "invalid_labels",
    )  # the end-of-turn token cannot be a label
    assert "special token '<|im_end|>'" in msg
    _error(client.post("/v1/retrieve", json=_body(items, surprise=1)), 422, "invalid_request")
    _error(client.post("/v1/retrieve", json=_body(items, profile="../etc")), 422, "invalid_request")


def test_n_larger_than_the_label_scheme_allows(make_client, items):
    client = make_client(max_images=30)
    images = [b64(items[0].images[i % 3]) for i in range(27)]
    msg = _error(
        client.post("/v1/retrieve", json=_body(items, images=images, labels="upper")),
        422,
        "invalid_labels",
    )
    assert "26" in msg


def test_malformed_json_wrong_type_and_media_type(client, items):
    r = client.post(
        "/v1/retrieve", content=b"{not json", headers={"content-type": "application/json"}
    )
    _error(r, 422, "invalid_request")
    _error(client.post("/v1/retrieve", json=["a", "list"]), 422, "invalid_request")
    r = client.post("/v1/retrieve", content=b"query=x", headers={"content-type": "text/plain"})
    _error(r, 415, "unsupported_media_type")


def test_multipart_problems(client, items):
    files = multipart_files(items[0].images)
    _error(client.post("/v1/retrieve", files=files), 422, "invalid_request")  # no query
    r = client.post("/v1/retrieve", data={"query": "x", "colour": "red"}, files=files)
    assert "colour" in _error(r, 422, "invalid_request")
    r = client.post("/v1/retrieve", data={"query": "x", "method": "nope"}, files=files)
    _error(r, 422, "invalid_request")
    bad = [("images", ("a.png", b"garbage", "image/png"))] * 3
    r = client.post("/v1/retrieve", data={"query": "x", "method": "vanilla"}, files=bad)
    _error(r, 400, "invalid_image")


def test_declared_body_too_large(make_client, items):
    client = make_client(max_body_bytes=1_000_000)
    r = client.post(
        "/v1/retrieve", content=b"x" * 2_000_000, headers={"content-type": "application/json"}
    )
    assert "LAD_MAX_BODY_BYTES" in _error(r, 413, "payload_too_large")
    assert r.headers["connection"] == "close"


def test_routing_errors_use_the_envelope(client):
    _error(client.get("/v1/nothing-here"), 404, "not_found")
    _error(client.get("/v1/retrieve"), 405, "method_not_allowed")
    _error(client.get("/v1/profiles/no-such-profile"), 404, "profile_not_found")


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ("mixed_n", "invalid_calibration"),
        ("answer_out_of_range", "invalid_calibration"),
        ("no_examples", "invalid_request"),
        ("too_many_examples", "invalid_request"),
        ("negative_answer", "invalid_request"),
        ("one_image", "invalid_request"),
        ("bad_image", "invalid_image"),
    ],
)
def test_calibration_input_errors(client, calibration_items, change, code):
    body = calibration_body(calibration_items)
    examples = body["examples"]
    status = 422
    if change == "mixed_n":
        examples[1]["images"] = examples[1]["images"][:2]
        examples[1]["answer"] = 0
    elif change == "answer_out_of_range":
        examples[2]["answer"] = 3
    elif change == "no_examples":
        body["examples"] = []
    elif change == "too_many_examples":
        body["examples"] = examples * 13  # 65
    elif change == "negative_answer":
        examples[0]["answer"] = -1
    elif change == "one_image":
        for ex in examples:
            ex["images"], ex["answer"] = ex["images"][:1], 0
    elif change == "bad_image":
        examples[3]["images"][0] = "@@@"
        status = 400
    _error(client.post("/v1/calibrate", json=body), status, code)
    # nothing was stored
    assert client.get("/v1/profiles").json()["profiles"] == []


def test_model_failure_fails_only_that_request(make_client, runner, items, caplog):
    client = make_client(runner_override=FaultyRunner(runner), max_batch_size=4, max_wait_ms=50)
    import concurrent.futures

    good = retrieve_body(items[0], method="vanilla")
    bad = {**good, "query": "boom"}
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda b: client.post("/v1/retrieve", json=b), [good, bad, good]))
    assert [a.status_code for a in answers] == [200, 500, 200]
    message = _error(answers[1], 500, "engine_error")
    assert "simulated" not in message and "RuntimeError" not in message  # no internals
    logged = [r for r in caplog.records if "simulated failure" in r.getMessage()]
    assert len(logged) == 1 and answers[1].json()["error"]["request_id"] in logged[0].getMessage()
    assert logged[0].exc_info is None  # one compact line, no traceback at ERROR
    assert client.post("/v1/retrieve", json=good).status_code == 200  # worker alive
    assert client.get("/readyz").json()["model"]["worker_running"] is True


def test_decompression_bomb_is_refused(client, items):
    huge = Image.new("1", (20000, 20000))  # 400 M pixels, a small PNG
    buffer = io.BytesIO()
    huge.save(buffer, format="PNG")
    images = [b64(items[0].images[0]), base64.b64encode(buffer.getvalue()).decode()]
    _error(client.post("/v1/retrieve", json=_body(items, images=images)), 413, "image_too_large")
