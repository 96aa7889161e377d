"""The one route table agrees with what the app serves: its routes (path, method, name,
token), its OpenAPI document (request bodies, per-status error codes and examples), the
body guard's limits, the content-type check and the audit log."""

from __future__ import annotations

import ast
import logging
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute

import lad_client.types as schemas
from app import errors
from app.api.deps import require_admin_token, require_retrieve_token
from app.api.middleware import SMALL_BODY_BYTES, body_limit
from app.api.route_errors import ERROR_OF
from app.api.route_table import BY_NAME, ROUTES, find
from app.observability.logs import AUDITED
from app.settings import Settings
from lad_client.routes import FORM, JSON
from tests.api.helpers import multipart_files

TOKEN_CHECK = {require_retrieve_token: "api_key", require_admin_token: "admin"}
DOCS_PATHS = {"/docs", "/docs/oauth2-redirect", "/redoc"}


def _routes(app: Any) -> list[Any]:
    """Every route of ``app``, through the included routers (which newer FastAPI keeps
    nested, reached by iter_route_contexts; before, ``app.routes`` is already flat)."""
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:
        return list(app.routes)
    return [context.original_route for context in iter_route_contexts(app.routes)]


def _served(app: Any) -> dict[tuple[str, str], APIRoute]:
    """(method, path) -> route of every API route the app serves (docs pages aside)."""
    served = {}
    for route in _routes(app):
        if isinstance(route, APIRoute) and route.path not in DOCS_PATHS:
            for method in route.methods:
                served[(method, route.path)] = route
    return served


def _auth(route: APIRoute) -> str:
    checks = [TOKEN_CHECK[d.call] for d in route.dependant.dependencies if d.call in TOKEN_CHECK]
    assert len(checks) <= 1, route.path
    return checks[0] if checks else "none"


def test_the_table_is_well_formed():
    assert len({(r.method, r.path) for r in ROUTES}) == len(ROUTES) == len(BY_NAME)
    for route in ROUTES:
        unknown = [code for code in route.errors if code not in ERROR_OF]
        assert not unknown, (route.name, unknown)
        assert len(set(route.errors)) == len(route.errors), route.name
        if route.auth != "none":  # a token check answers both
            assert {"unauthorized", "forbidden"} <= set(route.errors), route.name
        if route.content_types:
            assert "unsupported_media_type" in route.errors and route.request, route.name
            assert getattr(schemas, route.request).model_json_schema()["properties"]
        if FORM in route.content_types:
            assert route.form_files in getattr(schemas, route.request).model_fields
        assert route.response is None or hasattr(schemas, route.response), route.name
        if route.body_limit is not None:
            assert isinstance(getattr(Settings(_env_file=None), route.body_limit), int), route.name
        assert find(route.method, route.path.replace("{name}", "default")) is route


def test_the_app_serves_exactly_the_table(client):
    served = _served(client.app)
    assert set(served) == {(r.method, r.path) for r in ROUTES}
    for route in ROUTES:
        api = served[(route.method, route.path)]
        assert api.name == route.name and api.summary == route.summary, route.name
        assert api.methods == {route.method}, route.name
        assert _auth(api) == route.auth, route.name
        model = api.response_model
        assert (model.__name__ if model is not None else None) == route.response, route.name


def test_an_alias_is_its_target_under_another_path(client):
    """/v2/rerank and /rerank are POST /v1/rerank: one handler, one contract."""
    served = _served(client.app)
    aliases = [r for r in ROUTES if r.alias_of is not None]
    assert {r.path for r in aliases} == {"/v2/rerank", "/rerank"}
    for alias in aliases:
        target = BY_NAME[alias.alias_of]
        same = ("method", "response", "errors", "auth", "content_types", "request")
        assert all(getattr(alias, f) == getattr(target, f) for f in same), alias.name
        assert (alias.form_files, alias.body_limit) == (target.form_files, target.body_limit)
        handler = served[(alias.method, alias.path)].endpoint
        assert handler is served[(target.method, target.path)].endpoint, alias.name


def test_the_document_has_every_route_its_body_and_its_error_codes(client):
    document = client.get("/openapi.json").json()
    documented = {(m.upper(), p) for p, ops in document["paths"].items() for m in ops}
    assert documented == {(r.method, r.path) for r in ROUTES}
    for route in ROUTES:
        operation = document["paths"][route.path][route.method.lower()]
        assert operation["summary"] == route.summary
        assert bool(operation.get("security")) == (route.auth != "none"), route.name
        body = operation.get("requestBody", {}).get("content", {})
        assert tuple(body) == route.content_types, route.name
        if JSON in body:
            required = getattr(schemas, route.request).model_json_schema().get("required", [])
            assert body[JSON]["schema"].get("required", []) == required, route.name
        statuses = {cls.status for cls in map(ERROR_OF.__getitem__, route.errors)}
        documented_errors = {int(s) for s in operation["responses"] if int(s) >= 400}
        assert documented_errors == statuses, route.name
        for status in statuses:
            codes = [c for c in route.errors if ERROR_OF[c].status == status]
            response = operation["responses"][str(status)]
            assert all(f"`{code}`" in response["description"] for code in codes), route.name
            if route.name == "readyz" and status == 503:
                continue  # answered with the readiness report (documented as such)
            media = response["content"]["application/json"]
            assert media["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
            assert list(media["examples"]) == codes, (route.name, status)
            for code, example in media["examples"].items():
                assert example["value"]["error"]["code"] == code
                schemas.ErrorResponse.model_validate(example["value"])


def test_the_status_examples_carry_the_real_codes_of_that_status(client):
    """401 says unauthorized, 403 forbidden, 413 payload_too_large, ... (never the first code
    of the envelope's enum)."""
    responses = client.get("/openapi.json").json()["paths"]["/v1/calibrate"]["post"]["responses"]

    def codes(status: int) -> list[str]:
        return list(responses[str(status)]["content"]["application/json"]["examples"])

    assert codes(401) == ["unauthorized"] and codes(403) == ["forbidden"]
    assert codes(413) == ["payload_too_large", "image_too_large"]
    assert codes(415) == ["unsupported_media_type", "unsupported_image_format"]
    assert "invalid_request" not in codes(400) + codes(503)


def test_feedback_and_form_bodies_are_generated_from_the_models(client):
    paths = client.get("/openapi.json").json()["paths"]
    feedback = paths["/v1/feedback"]["post"]["requestBody"]["content"]
    assert set(feedback) == {JSON}
    assert set(feedback[JSON]["schema"]["properties"]) == {"request_id", "answer"}
    for path, model, files in (
        ("/v1/retrieve", schemas.RetrieveRequest, "images"),
        ("/v1/rerank", schemas.RerankRequest, "documents"),
    ):
        form = paths[path]["post"]["requestBody"]["content"][FORM]["schema"]
        assert set(form["properties"]) == set(model.model_fields), path
        assert form["properties"][files]["items"] == {"type": "string", "format": "binary"}
        assert form["additionalProperties"] is False
        assert all("anyOf" not in p for p in form["properties"].values()), path
    labels = paths["/v1/retrieve"]["post"]["requestBody"]["content"][FORM]["schema"]
    assert labels["properties"]["labels"]["type"] == "string"


def test_a_multipart_retrieval_works_as_the_generated_form_says(client, items):
    """The generated form (its field names, ``labels`` as one comma-list text) is what the
    form reader takes."""
    item = items[0]
    answer = client.post(
        "/v1/retrieve",
        files=multipart_files(item.images),
        data={"query": item.query, "labels": "x,y,z", "method": "vanilla"},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["method"] == "vanilla"


def test_the_body_guard_limits_come_from_the_table():
    settings = Settings(_env_file=None, max_body_bytes=10_000, max_calibrate_body_bytes=20_000)
    assert body_limit(settings, "POST", "/v1/retrieve") == (10_000, "LAD_MAX_BODY_BYTES")
    assert body_limit(settings, "POST", "/v1/rerank") == (10_000, "LAD_MAX_BODY_BYTES")
    assert body_limit(settings, "POST", "/v1/calibrate") == (20_000, "LAD_MAX_CALIBRATE_BODY_BYTES")
    for route in ROUTES:
        if route.body_limit is None:
            limit, _ = body_limit(settings, route.method, route.path.replace("{name}", "p"))
            assert limit == SMALL_BODY_BYTES, route.name
    assert body_limit(settings, "POST", "/nowhere")[0] == SMALL_BODY_BYTES


def test_a_small_body_limit_is_enforced_per_route(make_client):
    client = make_client(max_body_bytes=4096)
    big = b"x" * 5000
    r = client.post("/v1/retrieve", content=big, headers={"content-type": JSON})
    assert r.status_code == 413 and "LAD_MAX_BODY_BYTES" in r.json()["error"]["message"]
    r = client.post("/v1/calibrate", content=big, headers={"content-type": JSON})
    assert r.status_code != 413  # its own, larger limit


@pytest.mark.parametrize("route", [r for r in ROUTES if r.content_types], ids=lambda r: r.name)
def test_the_content_type_check_names_the_accepted_types(client, route):
    path = route.path.replace("{name}", "default")
    r = client.request(route.method, path, content=b"x", headers={"content-type": "text/plain"})
    assert r.status_code == 415, r.text
    error = r.json()["error"]
    assert error["code"] == "unsupported_media_type"
    assert error["message"].endswith("send " + " or ".join(route.content_types))


def test_the_audited_actions_are_the_tables():
    assert {(r.method, r.path): r.audit for r in ROUTES if r.audit} == AUDITED
    assert set(AUDITED.values()) == {"calibrate", "rollback", "delete", "refresh"}
    admin = {r.name for r in ROUTES if r.auth == "admin"}
    assert {r.name for r in ROUTES if r.audit} == admin  # every admin action is audited


def test_a_refresh_writes_an_audit_line(make_client, calibrate_json, caplog):
    client = make_client(admin_token="s3cret-admin", retrieve_token="s3cret-retrieve")
    admin = {"Authorization": "Bearer s3cret-admin"}
    assert client.post("/v1/calibrate", json=calibrate_json, headers=admin).status_code == 200
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lad"):
        refused = client.post(
            "/v1/profiles/default/refresh",
            params={"n": 3},
            headers={"Authorization": "Bearer s3cret-retrieve"},
        )
        done = client.post(
            "/v1/profiles/default/refresh", params={"n": 3, "force": True}, headers=admin
        )
    assert refused.status_code == 403 and done.status_code == 200, done.text
    audit = [dict(r.lad) for r in caplog.records if r.name == "lad.audit"]
    assert [a["action"] for a in audit] == ["refresh", "refresh"]
    assert [a["by"] for a in audit] == ["unauthenticated", "admin"]
    assert audit[0]["status"] == 403 and audit[0]["error_code"] == "forbidden"
    assert audit[1]["status"] == 200 and audit[1]["profile"] == "default" and audit[1]["n"] == 3
    assert audit[1].get("version") == done.json()["version"]


def test_the_route_table_imports_nothing_from_the_project():
    """It lives in the light client package (lad_client.routes): standard library only."""
    source = Path(__file__).resolve().parents[2] / "clients/python/lad_client/routes.py"
    tree = ast.parse(source.read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    imported |= {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert imported <= {"__future__", "dataclasses", "re", "typing"}, imported
    assert all(isinstance(cls, type) for cls in ERROR_OF.values())
    assert set(ERROR_OF) == {cls.code for cls in errors.ERRORS}
