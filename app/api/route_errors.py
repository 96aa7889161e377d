"""Which errors each route can answer, from the route table's wire codes: the routes'
OpenAPI ``responses=`` (per status, the envelope with one example per code of that status)
and the request counters created at 0 (so an error panel shows 0, not "No data", before the
first error)."""

from __future__ import annotations

from typing import Any

from app import errors
from app.api.error_handlers import error_body
from lad_client.routes import ROUTES, Route
from lad_client.types import ErrorResponse

ERROR_OF: dict[str, type[errors.ServiceError]] = {cls.code: cls for cls in errors.ERRORS}
"""Wire code -> its class (code, status, meaning), from the one table of causes."""

ROUTE_ERRORS: dict[tuple[str, str], tuple[type[errors.ServiceError], ...]] = {
    (route.method, route.path): tuple(ERROR_OF[code] for code in route.errors) for route in ROUTES
}
"""(HTTP verb, route template) -> the error classes it can answer (derived from ROUTES)."""

EXAMPLE_REQUEST_ID = "6f1c2b0e9d8a4e37b5a1c0d2e3f4a5b6"


def error_statuses(route: tuple[str, str]) -> list[int]:
    """The HTTP statuses of the errors ``route`` (verb, template) can answer, ascending."""
    return sorted({cls.status for cls in ROUTE_ERRORS[route]})


def by_status(route: Route) -> dict[int, list[type[errors.ServiceError]]]:
    """The route's error classes grouped by HTTP status, ascending, in table order."""
    grouped: dict[int, list[type[errors.ServiceError]]] = {}
    for code in route.errors:
        cls = ERROR_OF[code]
        grouped.setdefault(cls.status, []).append(cls)
    return dict(sorted(grouped.items()))


def error_example(cls: type[errors.ServiceError]) -> dict[str, Any]:
    """An OpenAPI example object: the envelope as ``cls`` is answered."""
    body = error_body(cls.code, cls.meaning, EXAMPLE_REQUEST_ID)
    return {"summary": cls.meaning, "value": body}


def error_responses(route: Route) -> dict[int | str, dict[str, Any]]:
    """FastAPI ``responses=`` for a route: per status, the error envelope, its codes in the
    description and one example per code."""
    responses: dict[int | str, dict[str, Any]] = {}
    for status, classes in by_status(route).items():
        codes = "; ".join(f"`{cls.code}`: {cls.meaning}" for cls in classes)
        examples = {cls.code: error_example(cls) for cls in classes}
        responses[status] = {
            "model": ErrorResponse,
            "description": f"error codes: {codes}",
            "content": {"application/json": {"examples": examples}},
        }
    return responses
