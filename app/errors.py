"""Errors a client can act on: one type per cause, one table of causes, statuses and meanings.

Every error answer has the same body, ``{"error": {"code", "message", "request_id"}}``,
whether it comes from our code, from FastAPI's request validation (422), from routing
(404/405), from the body guard (408/413), from the store, the queue or an unexpected
failure (500). Messages are written for the client and never carry internals (exception
text, addresses, paths); the details go to the log under the same request id.

This module is the taxonomy (codes, classes, what they mean) and the mapping of the queue's
and the store's exceptions onto it (``translate``). The HTTP side, the envelope and the
FastAPI handlers, is ``app.api.error_handlers``; the request id is
``app.observability.request_context``.
"""

from __future__ import annotations

import logging
from typing import ClassVar

from app.engine.batcher import BatcherStopped, QueueFull
from calibration_store.base import NoPreviousVersion as StoreNoPreviousVersion
from calibration_store.base import ProfileNotFound as StoreProfileNotFound
from calibration_store.base import StoreCorrupt as StoreDocumentCorrupt
from calibration_store.base import StoreUnavailable as StoreDown

log = logging.getLogger(__name__)

ECHO_CHARS = 200
"""Most characters of a client's value (a method, a path, a name, a field) that an answer
or a log line repeats; the rest is cut to an ellipsis."""
MAX_MESSAGE_CHARS = 1000
"""Most characters of an error message, whatever it echoes."""


def clip(value: object, limit: int = ECHO_CHARS) -> str:
    """``value`` as text within ``limit`` characters (cut ones end in an ellipsis): the
    one way an answer or a log line repeats what a client sent."""
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "…"


class ServiceError(Exception):
    """Base of the service's errors: `code` is the stable cause, `status` its HTTP status,
    `meaning` the one-line explanation shown in docs/api.md and in the OpenAPI schema."""

    code: ClassVar[str] = "error"
    status: ClassVar[int] = 500
    meaning: ClassVar[str] = ""

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


# --- the request itself --------------------------------------------------------------------
class InvalidRequest(ServiceError):
    code, status = "invalid_request", 422
    meaning = "the body, a form field or a query parameter does not match the schema"


class BadRequest(ServiceError):
    code, status = "bad_request", 400
    meaning = "the HTTP request itself is malformed (e.g. a broken multipart body)"


class HeadersTooLarge(ServiceError):
    code, status = "headers_too_large", 431
    meaning = "the request line and headers are over 64 KiB (the connection is closed)"


class InvalidImage(ServiceError):
    code, status = "invalid_image", 400
    meaning = "an image is not valid base64, is empty, truncated or not an image"


class UnsupportedImageFormat(ServiceError):
    code, status = "unsupported_image_format", 415
    meaning = "an image is in a format outside LAD_IMAGE_FORMATS (e.g. PDF, SVG, EPS, TIFF)"


class UnsupportedImage(ServiceError):
    code, status = "unsupported_image", 422
    meaning = (
        "an image decodes but its aspect ratio is beyond LAD_MAX_ASPECT_RATIO, or its header "
        "holds more segments, chunks or metadata than any real image "
        "(app/service/decode/headers.py)"
    )


class ImageTooLarge(ServiceError):
    code, status = "image_too_large", 413
    meaning = (
        "an image is over LAD_MAX_IMAGE_BYTES or LAD_MAX_IMAGE_PIXELS, or the request's images "
        "over LAD_MAX_REQUEST_PIXELS decoded pixels"
    )


class MediaNotAllowed(ServiceError):
    code, status = "media_not_allowed", 400
    meaning = (
        "an image URL the service may not fetch: URLs are off (LAD_MEDIA_ALLOWED_DOMAINS is "
        "empty, the default), a scheme other than http(s) (file:// never), a host outside "
        "LAD_MEDIA_ALLOWED_DOMAINS, or a host or redirect that resolves to a private, "
        "loopback, link-local or other non-public address outside LAD_MEDIA_ALLOWED_NETWORKS"
    )


class MediaFetchFailed(ServiceError):
    code, status = "media_fetch_failed", 422
    meaning = (
        "an allowed image URL could not be fetched: its host did not resolve or refused the "
        "connection, answered other than 200 (e.g. 404), or redirected more than "
        "LAD_MEDIA_MAX_REDIRECTS times"
    )


class MediaFetchTimeout(ServiceError):
    code, status = "media_fetch_timeout", 408
    meaning = (
        "an image URL's bytes, redirects included, did not arrive within LAD_MEDIA_TIMEOUT_S "
        "(like a body that arrives too slowly: the request's content did not come in time)"
    )


class PayloadTooLarge(ServiceError):
    code, status = "payload_too_large", 413
    meaning = "the request body is over the route's limit (LAD_MAX_BODY_BYTES, ...)"


class RequestTimeout(ServiceError):
    code, status = "request_timeout", 408
    meaning = (
        "the request body did not arrive within LAD_READ_TIMEOUT_S, or arrived slower than "
        "LAD_MIN_TRANSFER_BYTES_PER_S after LAD_TRANSFER_GRACE_S"
    )


class TooManyImages(ServiceError):
    code, status = "too_many_images", 422
    meaning = "more than LAD_MAX_IMAGES candidate images"


class TooFewImages(ServiceError):
    code, status = "too_few_images", 422
    meaning = "fewer than 2 candidate images (retrieve, calibrate); no document (rerank)"


class InvalidQuery(ServiceError):
    code, status = "invalid_query", 422
    meaning = (
        "the query is blank, over LAD_MAX_QUERY_CHARS, holds control characters or one of "
        "the model's special tokens"
    )


class InvalidLabels(ServiceError):
    code, status = "invalid_labels", 422
    meaning = (
        "unknown label scheme, wrong count, duplicates, a label over LAD_MAX_LABEL_CHARS, "
        "over LAD_MAX_LABEL_TOKENS tokens in all, or labels the model cannot score"
    )


class PromptTooLong(ServiceError):
    code, status = "prompt_too_long", 422
    meaning = (
        "the prompt, images and label included, is longer than the model's context (its token "
        "count and the limit are in the message): fewer or smaller images, or a lower "
        "LAD_MAX_PIXELS"
    )


class InvalidCalibration(ServiceError):
    code, status = "invalid_calibration", 422
    meaning = "calibration examples with different N, or an answer outside 0..N-1"


class UnsupportedMediaType(ServiceError):
    code, status = "unsupported_media_type", 415
    meaning = "a content type other than application/json (or multipart/form-data on retrieve)"


# --- who is asking -------------------------------------------------------------------------
class Unauthorized(ServiceError):
    code, status = "unauthorized", 401
    meaning = "the route needs a bearer token and none was sent"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class Forbidden(ServiceError):
    code, status = "forbidden", 403
    meaning = "the bearer token is not valid for this route"


# --- routing -------------------------------------------------------------------------------
class NotFound(ServiceError):
    code, status = "not_found", 404
    meaning = "no such route"


class MethodNotAllowed(ServiceError):
    code, status = "method_not_allowed", 405
    meaning = "the route exists but not for this HTTP method (see the Allow header)"


class ModelNotFound(ServiceError):
    code, status = "model_not_found", 404
    meaning = "the request names a model other than the served one (GET /v1/models lists it)"


# --- profiles ------------------------------------------------------------------------------
class ProfileNotFound(ServiceError):
    code, status = "profile_not_found", 404
    meaning = "no such profile, (labels, N) or kept version"


class CalibrationRequired(ServiceError):
    code, status = "calibration_required", 409
    meaning = "no calibration for this model, profile, labels and N (calibrate, or use vanilla)"


class ProfileMismatch(ServiceError):
    code, status = "profile_mismatch", 409
    meaning = "the profile was calibrated under another engine configuration; recalibrate"


class NoPreviousVersion(ServiceError):
    code, status = "no_previous_version", 409
    meaning = "rollback asked for, but no older version is kept"


class RequestNotFound(ServiceError):
    code, status = "request_not_found", 404
    meaning = "feedback for a request id whose evidence is unknown or expired (LAD_EVIDENCE_TTL_S)"


class ProfileGone(ServiceError):
    code, status = "profile_deleted", 409
    meaning = "feedback for a request whose profile has since been deleted (or never existed)"


class RefreshUnavailable(ServiceError):
    code, status = "refresh_unavailable", 409
    meaning = "the current version keeps no offline statistics to blend feedback into; recalibrate"


# --- the service's state -------------------------------------------------------------------
class Overloaded(ServiceError):
    code, status = "overloaded", 429
    meaning = (
        "the queue has no room for the request's forward passes, LAD_MAX_IN_FLIGHT "
        "requests are being handled, or LAD_MAX_INFLIGHT_BYTES are held; retry after "
        "Retry-After"
    )

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message, headers={"Retry-After": str(int(retry_after_s))})
        self.retry_after_s = retry_after_s


class DeadlineExceeded(ServiceError):
    code, status = "deadline_exceeded", 504
    meaning = (
        "the request's X-Request-Timeout passed before its answer was ready; its work was "
        "dropped, not computed (a client's own bound: not in the 5xx alert)"
    )


class NotReady(ServiceError):
    code, status = "not_ready", 503
    meaning = "the model is not loaded yet or the service is shutting down"


class StoreUnavailable(ServiceError):
    code, status = "store_unavailable", 503
    meaning = "the calibration store cannot be reached (admin routes; retrieval serves its copy)"


class StoreCorrupt(ServiceError):
    code, status = "store_corrupt", 500
    meaning = "a stored document cannot be read back (a server fault; the log names it)"


class EngineFailure(ServiceError):
    code, status = "engine_error", 500
    meaning = "the model failed on this request (details in the server log)"


class InternalError(ServiceError):
    code, status = "internal_error", 500
    meaning = "an unexpected failure (details in the server log)"


ERRORS: tuple[type[ServiceError], ...] = (
    InvalidRequest,
    BadRequest,
    InvalidImage,
    UnsupportedImageFormat,
    UnsupportedImage,
    ImageTooLarge,
    MediaNotAllowed,
    MediaFetchFailed,
    MediaFetchTimeout,
    PayloadTooLarge,
    RequestTimeout,
    TooManyImages,
    TooFewImages,
    InvalidQuery,
    InvalidLabels,
    PromptTooLong,
    InvalidCalibration,
    UnsupportedMediaType,
    Unauthorized,
    Forbidden,
    NotFound,
    MethodNotAllowed,
    ProfileNotFound,
    CalibrationRequired,
    ProfileMismatch,
    NoPreviousVersion,
    RequestNotFound,
    ProfileGone,
    RefreshUnavailable,
    Overloaded,
    DeadlineExceeded,
    NotReady,
    StoreUnavailable,
    StoreCorrupt,
    EngineFailure,
    InternalError,
    HeadersTooLarge,
    ModelNotFound,
)
"""The one table of causes: each class carries its code, HTTP status and meaning."""


def translate(exc: BaseException) -> ServiceError | None:
    """Our error for an exception raised by the queue or the store (None if unknown)."""
    if isinstance(exc, ServiceError):
        return exc
    if isinstance(exc, QueueFull):
        return Overloaded(
            f"the request queue has no room for {exc.needed} forward pass(es) ({exc.depth} "
            f"waiting); retry in {exc.retry_after_s} s",
            exc.retry_after_s,
        )
    if isinstance(exc, BatcherStopped):
        return NotReady("the model worker is not running; retry shortly")
    if isinstance(exc, StoreProfileNotFound):
        return ProfileNotFound(str(exc) or "no such profile or version")
    if isinstance(exc, StoreNoPreviousVersion):
        return NoPreviousVersion(str(exc) or "no older version is kept to roll back to")
    if isinstance(exc, StoreDocumentCorrupt):
        log.error("calibration store: %s", exc)  # which document: for the operator only
        return StoreCorrupt(
            "a stored calibration document cannot be read back; the server "
            "log names it (recalibrate, or delete the profile)"
        )
    if isinstance(exc, StoreDown):
        return StoreUnavailable("the calibration store is unavailable; retry shortly")
    return None
