"""Which error codes each route can answer: the one table behind the routes' OpenAPI
``responses=`` and the request counters created at 0 (so an error panel shows 0, not
"No data", before the first error)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from app import errors
from app.schemas import ErrorResponse

Route = tuple[str, str]  # (HTTP verb, route template)

ANY = (errors.InternalError,)
"""What any route may answer: an unexpected failure."""
MODEL = (*ANY, errors.NotReady)
"""Routes that need the loaded model and its worker."""
JSON_BODY = (errors.InvalidRequest, errors.PayloadTooLarge)
"""Routes that read a JSON body."""
ANY_BODY = (*JSON_BODY, errors.BadRequest, errors.UnsupportedMediaType)
"""Routes that read a JSON or a multipart body."""
IMAGES = (errors.InvalidImage, errors.ImageTooLarge, errors.TooManyImages,
          errors.TooFewImages, errors.InvalidQuery, errors.InvalidLabels)  # fmt: skip
"""Routes that decode a query and candidate images."""
AUTH = (errors.Unauthorized, errors.Forbidden)
PROFILE_KEY = (errors.InvalidRequest, errors.InvalidLabels, errors.ProfileNotFound)
"""Routes addressed to one stored profile (name, labels, N)."""

ROUTE_ERRORS: dict[Route, tuple[type[errors.ServiceError], ...]] = {
    ("POST", "/v1/retrieve"): (
        *MODEL, *ANY_BODY, *IMAGES, *AUTH, errors.CalibrationRequired, errors.ProfileMismatch,
        errors.Overloaded, errors.EngineFailure,
    ),
    ("POST", "/v1/calibrate"): (
        *MODEL, *JSON_BODY, *IMAGES, *AUTH, errors.InvalidCalibration, errors.StoreUnavailable,
        errors.EngineFailure,
    ),
    ("GET", "/v1/profiles"): (*MODEL, errors.StoreUnavailable),
    ("GET", "/v1/profiles/{name}"): (
        *MODEL, errors.InvalidRequest, errors.ProfileNotFound, errors.StoreUnavailable,
    ),
    ("DELETE", "/v1/profiles/{name}"): (*MODEL, *PROFILE_KEY, *AUTH, errors.StoreUnavailable),
    ("POST", "/v1/profiles/{name}/rollback"): (
        *MODEL, *PROFILE_KEY, *AUTH, errors.NoPreviousVersion, errors.StoreUnavailable,
    ),
    ("GET", "/healthz"): ANY,
    ("GET", "/readyz"): ANY,
    ("GET", "/metrics"): ANY,
}


def _unique(classes: Iterable[type[errors.ServiceError]]) -> list[type[errors.ServiceError]]:
    return list(dict.fromkeys(classes))


def error_statuses(route: Route) -> list[int]:
    """The HTTP statuses of the errors ``route`` can answer, ascending."""
    return sorted({errors.HTTP_STATUS[cls] for cls in ROUTE_ERRORS[route]})


def error_responses(verb: str, path: str) -> dict[int | str, dict[str, Any]]:
    """FastAPI ``responses=`` for a route: per status, the error envelope and its codes."""
    by_status: dict[int, list[type[errors.ServiceError]]] = {}
    for cls in _unique(ROUTE_ERRORS[(verb, path)]):
        by_status.setdefault(errors.HTTP_STATUS[cls], []).append(cls)
    responses: dict[int | str, dict[str, Any]] = {}
    for status, classes in sorted(by_status.items()):
        codes = "; ".join(
            f"`{cls.code}`" + (f": {cls.meaning}" if getattr(cls, "meaning", "") else "")
            for cls in classes
        )
        responses[status] = {"model": ErrorResponse, "description": f"error codes: {codes}"}
    return responses
