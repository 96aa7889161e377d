"""The OpenAPI document: every field described, every request with a working example,
every error code per route, and the docs pages served without any outside host."""

from __future__ import annotations

import re
from typing import Any

from app import errors
from app.api.route_errors import ROUTE_ERRORS


def _properties(node: Any, where: str = "") -> list[tuple[str, dict]]:
    """Every (path, property schema) under ``node``."""
    found = []
    if isinstance(node, dict):
        for name, prop in (node.get("properties") or {}).items():
            found.append((f"{where}.{name}", prop))
        for key, value in node.items():
            found += _properties(value, f"{where}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _properties(value, f"{where}[{i}]")
    return found


def test_every_field_and_parameter_is_described(client):
    spec = client.get("/openapi.json").json()
    undescribed = [path for path, prop in _properties(spec) if not prop.get("description")]
    assert not undescribed, undescribed
    for path, operations in spec["paths"].items():
        for verb, operation in operations.items():
            for param in operation.get("parameters", []):
                assert param.get("description"), (verb, path, param["name"])
                assert (
                    "example" in param or "examples" in param or param["schema"].get("examples")
                ), (verb, path, param["name"])


def test_every_route_lists_its_error_codes_from_the_one_table(client):
    spec = client.get("/openapi.json").json()
    for (verb, path), classes in ROUTE_ERRORS.items():
        responses = spec["paths"][path][verb.lower()]["responses"]
        for cls in classes:
            status = str(cls.status)
            assert status in responses, (verb, path, status)
            if status != "503" or path != "/readyz":
                assert f"`{cls.code}`" in responses[status]["description"], (verb, path, cls)


def test_the_request_examples_work_as_sent(client):
    spec = client.get("/openapi.json").json()
    retrieve = spec["paths"]["/v1/retrieve"]["post"]["requestBody"]["content"]
    example = retrieve["application/json"]["example"]
    answer = client.post("/v1/retrieve", json=example)
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["probabilities"]) == len(example["images"])
    calibrate = spec["paths"]["/v1/calibrate"]["post"]["requestBody"]["content"]
    (named,) = calibrate["application/json"]["examples"].values()
    done = client.post("/v1/calibrate", json=named["value"])
    assert done.status_code == 200, done.text
    debiased = client.post("/v1/retrieve", json={**example, "method": "agd"})
    assert debiased.status_code == 200 and debiased.json()["debiased"] is True


def test_docs_pages_load_nothing_from_outside(client):
    for page in ("/docs", "/redoc"):
        html = client.get(page)
        assert html.status_code == 200
        urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html.text)
        assert urls and all(u.startswith("/") for u in urls), urls
        assert not re.search(r"https?://", html.text), page
        for url in urls:
            asset = client.get(url)
            assert asset.status_code == 200, url
            if url.endswith(".png"):  # the favicon: 412 bytes in fastapi-offline 1.7
                assert asset.content.startswith(b"\x89PNG\r\n\x1a\n"), url
            else:  # the page's scripts and styles
                assert len(asset.content) > 1000, url
    assert '"validatorUrl": null' in client.get("/docs").text  # no validator badge request


def test_the_document_states_the_running_limits(make_client):
    """JSON and multipart bodies of retrieve and rerank carry this instance's bounds."""
    document = make_client(max_images=5, max_rerank_candidates=20).get("/openapi.json").json()
    found = _properties(document)
    images = [prop for path, prop in found if path.endswith(".images") and "maxItems" in prop]
    documents = [prop for path, prop in found if path.endswith(".documents")]
    assert len(images) >= 2 and all(p["maxItems"] == 5 for p in images)  # JSON + multipart
    assert len(documents) >= 2 and all(p["maxItems"] == 20 for p in documents)


def test_error_codes_are_an_enum_in_the_document_and_a_string_on_the_wire(client):
    """The served document lists every code of app.errors.ERRORS; the client's wire type
    takes any string, so a code added by a newer server still parses."""
    from lad_client.types import ErrorResponse

    spec = client.get("/openapi.json").json()
    code = spec["components"]["schemas"]["ErrorDetail"]["properties"]["code"]
    assert code["enum"] == [cls.code for cls in errors.ERRORS]
    assert len(code["enum"]) == len(set(code["enum"])) >= 20
    future = {"error": {"code": "a_code_from_the_future", "message": "m", "request_id": None}}
    assert ErrorResponse.model_validate(future).error.code == "a_code_from_the_future"
