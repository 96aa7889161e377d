"""The route decorator derived from the route table: ``@register(router, "retrieve")`` gives
a handler its path, method, name, summary, response model, token dependency, error
responses and request-body docs, all from ``lad_client.routes.ROUTES``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, params
from fastapi.responses import Response

import lad_client.types as wire
from app.api.deps import AdminAuth, RetrieveAuth
from app.api.openapi import request_body
from app.api.route_errors import error_responses
from lad_client.routes import BY_NAME, Auth, Route

Handler = TypeVar("Handler", bound=Callable[..., Any])

AUTH_DEPENDENCIES: dict[Auth, list[params.Depends]] = {
    "none": [],
    "api_key": [RetrieveAuth],
    "admin": [AdminAuth],
}
"""The token check of each kind of route (run before the handler reads any body)."""


def model(name: str) -> Any:
    """A wire model of lad_client.types by its class name (as the route table names it)."""
    return getattr(wire, name)


def route_options(
    route: Route,
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
        options["response_model"] = model(route.response)
    if route.request is not None:
        options["openapi_extra"] = request_body(
            model(route.request), route.content_types, route.form_files, json_examples
        )
    return options


def register(router: APIRouter, name: str, **extra: Any) -> Callable[[Handler], Handler]:
    """Decorate a handler as the table's route ``name``; ``extra`` are further
    ``api_route`` arguments (``description``) or ``route_options``' own."""
    own = {k: extra.pop(k) for k in ("json_examples", "responses") if k in extra}
    options = route_options(BY_NAME[name], **own)
    return router.api_route(**options, **extra)
