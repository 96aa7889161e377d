"""Errors a client can act on: one type per cause, one table mapping each to an HTTP status.

Every error answer has the same body, ``{"error": {"code": "...", "message": "..."}}``,
whether it comes from our code, from FastAPI's request validation (422), from routing
(404/405), from the store, the queue or an unexpected failure (500). `install_error_handlers`
is the only place that turns exceptions into HTTP responses.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.engine.batcher import BatcherStopped, QueueFull
from calibration_store.base import NoPreviousVersion as StoreNoPreviousVersion
from calibration_store.base import ProfileNotFound as StoreProfileNotFound
from calibration_store.base import StoreUnavailable as StoreDown

log = logging.getLogger(__name__)


class ServiceError(Exception):
    """Base of the service's errors; `code` is the stable machine-readable cause."""

    code: ClassVar[str] = "error"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


# --- the request itself --------------------------------------------------------------------
class InvalidRequest(ServiceError):
    code = "invalid_request"


class BadRequest(ServiceError):
    code = "bad_request"


class InvalidImage(ServiceError):
    code = "invalid_image"


class ImageTooLarge(ServiceError):
    code = "image_too_large"


class PayloadTooLarge(ServiceError):
    code = "payload_too_large"


class TooManyImages(ServiceError):
    code = "too_many_images"


class TooFewImages(ServiceError):
    code = "too_few_images"


class InvalidQuery(ServiceError):
    code = "invalid_query"


class InvalidLabels(ServiceError):
    code = "invalid_labels"


class InvalidCalibration(ServiceError):
    code = "invalid_calibration"


class UnsupportedMediaType(ServiceError):
    code = "unsupported_media_type"


# --- who is asking -------------------------------------------------------------------------
class Unauthorized(ServiceError):
    code = "unauthorized"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class Forbidden(ServiceError):
    code = "forbidden"


# --- routing -------------------------------------------------------------------------------
class NotFound(ServiceError):
    code = "not_found"


class MethodNotAllowed(ServiceError):
    code = "method_not_allowed"


# --- profiles ------------------------------------------------------------------------------
class ProfileNotFound(ServiceError):
    code = "profile_not_found"


class CalibrationRequired(ServiceError):
    code = "calibration_required"


class ProfileMismatch(ServiceError):
    code = "profile_mismatch"


class NoPreviousVersion(ServiceError):
    code = "no_previous_version"


# --- the service's state -------------------------------------------------------------------
class Overloaded(ServiceError):
    code = "overloaded"

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message, headers={"Retry-After": str(int(retry_after_s))})
        self.retry_after_s = retry_after_s


class NotReady(ServiceError):
    code = "not_ready"


class StoreUnavailable(ServiceError):
    code = "store_unavailable"


class EngineFailure(ServiceError):
    code = "engine_error"


class InternalError(ServiceError):
    code = "internal_error"


HTTP_STATUS: dict[type[ServiceError], int] = {
    InvalidRequest: 422,
    BadRequest: 400,
    InvalidImage: 400,
    ImageTooLarge: 413,
    PayloadTooLarge: 413,
    TooManyImages: 422,
    TooFewImages: 422,
    InvalidQuery: 422,
    InvalidLabels: 422,
    InvalidCalibration: 422,
    UnsupportedMediaType: 415,
    Unauthorized: 401,
    Forbidden: 403,
    NotFound: 404,
    MethodNotAllowed: 405,
    ProfileNotFound: 404,
    CalibrationRequired: 409,
    ProfileMismatch: 409,
    NoPreviousVersion: 409,
    Overloaded: 429,
    NotReady: 503,
    StoreUnavailable: 503,
    EngineFailure: 500,
    InternalError: 500,
}
"""The one mapping from cause to HTTP status."""

_BY_STATUS: dict[int, type[ServiceError]] = {
    400: BadRequest,
    404: NotFound,
    405: MethodNotAllowed,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    401: Unauthorized,
    403: Forbidden,
}


def status_of(error: ServiceError) -> int:
    for cls in type(error).__mro__:
        if cls in HTTP_STATUS:
            return HTTP_STATUS[cls]
    return 500


def translate(exc: BaseException) -> ServiceError | None:
    """Our error for an exception raised by the queue or the store (None if unknown)."""
    if isinstance(exc, ServiceError):
        return exc
    if isinstance(exc, QueueFull):
        return Overloaded(
            f"the request queue is full ({exc.depth} waiting); retry in {exc.retry_after_s} s",
            exc.retry_after_s,
        )
    if isinstance(exc, BatcherStopped):
        return NotReady(f"the model worker is not running: {exc}")
    if isinstance(exc, StoreProfileNotFound):
        return ProfileNotFound(str(exc) or "no such profile")
    if isinstance(exc, StoreNoPreviousVersion):
        return NoPreviousVersion(str(exc) or "no older version is kept to roll back to")
    if isinstance(exc, StoreDown):
        return StoreUnavailable(f"the calibration store is unavailable: {exc}")
    return None


def error_body(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def error_response(error: ServiceError) -> JSONResponse:
    return JSONResponse(
        error_body(error.code, error.message), status_code=status_of(error), headers=error.headers
    )


def _validation_message(exc: RequestValidationError) -> str:
    """'body.images.0: Input should be a valid string; ...' (first five problems)."""
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{where}: {err.get('msg', 'invalid')}" if where else err.get("msg", ""))
    more = len(exc.errors()) - 5
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def install_error_handlers(app: FastAPI) -> None:
    """Route every exception to the common envelope (the one exception -> status place)."""

    async def on_service_error(request: Request, exc: Exception) -> JSONResponse:
        error = translate(exc) or InternalError("unexpected error")
        return error_response(error)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(InvalidRequest(_validation_message(exc)))

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        cls = _BY_STATUS.get(exc.status_code)
        message = str(exc.detail) if exc.detail else "HTTP error"
        if cls is None:
            body = error_body("http_error", message)
            return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)
        error = cls(message)
        error.headers.update(exc.headers or {})
        return error_response(error)

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(InternalError("internal error; see the server log"))

    for exc_type in (
        ServiceError, QueueFull, BatcherStopped, StoreProfileNotFound, StoreNoPreviousVersion,
        StoreDown,
    ):
        app.add_exception_handler(exc_type, on_service_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)
