"""The route decorator derived from the route table: ``@register(router, RETRIEVE)`` gives
a handler its path, method, name, summary, response model, token dependency, error
responses and request-body docs, all from its entry of ``app.api.route_table``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, params
from fastapi.responses import Response

from app.api.deps import AdminAuth, RetrieveAuth
from app.api.openapi import request_body
from app.api.route_errors import error_responses
from app.api.route_table import ServedRoute
from lad_client.routes import Auth

Handler = TypeVar("Handler", bound=Callable[..., Any])

AUTH_DEPENDENCIES: dict[Auth, list[params.Depends]] = {
    "none": [],
    "api_key": [RetrieveAuth],
    "admin": [AdminAuth],
}
"""The token check of each kind of route (run before the handler reads any body)."""


def route_options(
    route: ServedRoute,
    *,
    json_examples: dict[str, Any] | None = None,
    responses: dict[int | str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """``APIRouter.api_route`` arguments of a table route; ``responses`` are added over
    the error responses (a status whose body is not the error envelope)."""
    options: dict[str, Any] = {
        "path": route.path,
        "methods": [route.method],
        "name": route.name,
        "summary": route.summary,
        "dependencies": list(AUTH_DEPENDENCIES[route.auth]),
        "responses": {**error_responses(route), **(responses or {})},
    }
    if route.response is None:
        options["response_class"] = Response
    else:
        options["response_model"] = route.response_model
    if route.request_model is not None:
        options["openapi_extra"] = request_body(
            route.request_model, route.content_types, route.form_files, json_examples
        )
    return options


def register(router: APIRouter, route: ServedRoute, **extra: Any) -> Callable[[Handler], Handler]:
    """Decorate a handler as the table's ``route``; ``extra`` are further ``api_route``
    arguments (``description``) or ``route_options``' own."""
    own = {k: extra.pop(k) for k in ("json_examples", "responses") if k in extra}
    options = route_options(route, **own)
    return router.api_route(**options, **extra)
