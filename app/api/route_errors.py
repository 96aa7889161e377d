"""Which error codes each route can answer: the one table behind the routes' OpenAPI
``responses=`` and the request counters created at 0 (so an error panel shows 0, not
"No data", before the first error)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from app import errors
from lad_client.types import ErrorResponse

Route = tuple[str, str]  # (HTTP verb, route template)

ANY = (errors.BadRequest, errors.RequestTimeout, errors.PayloadTooLarge, errors.InternalError)
"""What any route may answer: a malformed request, a body over the route's limit or too
slow (the body guard), an unexpected failure."""
MODEL = (*ANY, errors.InvalidRequest, errors.NotReady, errors.Overloaded)
"""Routes that need the loaded model and its worker (they also validate parameters), and
count towards LAD_MAX_IN_FLIGHT."""
BODY = (errors.UnsupportedMediaType,)
"""Routes that read a body of a given content type."""
IMAGES = (errors.InvalidImage, errors.UnsupportedImageFormat, errors.UnsupportedImage,
          errors.ImageTooLarge, errors.TooManyImages, errors.TooFewImages, errors.InvalidQuery,
          errors.InvalidLabels, errors.PromptTooLong)  # fmt: skip
"""Routes that decode a query and candidate images."""
AUTH = (errors.Unauthorized, errors.Forbidden)
ADMIN = (*AUTH, errors.StoreUnavailable)
"""Admin routes: a token, and the store behind them."""
PROFILE_KEY = (errors.InvalidLabels, errors.ProfileNotFound)
"""Routes addressed to one stored profile (name, labels, N)."""

ROUTE_ERRORS: dict[Route, tuple[type[errors.ServiceError], ...]] = {
    ("POST", "/v1/retrieve"): (
        *MODEL, *BODY, *IMAGES, *AUTH, errors.CalibrationRequired, errors.ProfileMismatch,
        errors.Overloaded, errors.EngineFailure,
    ),
    ("POST", "/v1/rerank"): (
        *MODEL, *BODY, *IMAGES, *AUTH, errors.CalibrationRequired, errors.ProfileMismatch,
        errors.Overloaded, errors.EngineFailure,
    ),
    ("POST", "/v1/calibrate"): (
        *MODEL, *BODY, *IMAGES, *ADMIN, errors.InvalidCalibration, errors.EngineFailure,
    ),
    ("GET", "/v1/profiles"): (*MODEL, errors.StoreUnavailable),
    ("GET", "/v1/profiles/{name}"): (*MODEL, errors.ProfileNotFound, errors.StoreUnavailable,
                                     errors.StoreCorrupt),
    ("DELETE", "/v1/profiles/{name}"): (*MODEL, *PROFILE_KEY, *ADMIN),
    ("POST", "/v1/profiles/{name}/rollback"): (
        *MODEL, *PROFILE_KEY, *ADMIN, errors.NoPreviousVersion, errors.StoreCorrupt,
    ),
    ("POST", "/v1/feedback"): (
        *ANY, errors.InvalidRequest, errors.NotReady, errors.Overloaded, *BODY, *AUTH,
        errors.RequestNotFound, errors.ProfileGone, errors.StoreUnavailable,
    ),
    ("POST", "/v1/profiles/{name}/refresh"): (
        *MODEL, *PROFILE_KEY, *ADMIN, errors.RefreshUnavailable,
    ),
    ("GET", "/healthz"): ANY,
    ("GET", "/readyz"): (*ANY, errors.NotReady),
    ("GET", "/metrics"): ANY,
}


def _unique(classes: Iterable[type[errors.ServiceError]]) -> list[type[errors.ServiceError]]:
    return list(dict.fromkeys(classes))


def error_statuses(route: Route) -> list[int]:
    """The HTTP statuses of the errors ``route`` can answer, ascending."""
    return sorted({cls.status for cls in ROUTE_ERRORS[route]})


def error_responses(verb: str, path: str) -> dict[int | str, dict[str, Any]]:
    """FastAPI ``responses=`` for a route: per status, the error envelope and its codes."""
    by_status: dict[int, list[type[errors.ServiceError]]] = {}
    for cls in _unique(ROUTE_ERRORS[(verb, path)]):
        by_status.setdefault(cls.status, []).append(cls)
    responses: dict[int | str, dict[str, Any]] = {}
    for status, classes in sorted(by_status.items()):
        codes = "; ".join(f"`{cls.code}`: {cls.meaning}" for cls in classes)
        responses[status] = {"model": ErrorResponse, "description": f"error codes: {codes}"}
    return responses
