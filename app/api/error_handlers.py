"""The HTTP side of the errors of ``app.errors``: the one envelope, the response, and the
FastAPI handlers that turn every known exception into it.

``install_error_handlers`` and ``unexpected_error_response`` are the only places that turn
exceptions into HTTP responses.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.engine.batcher import BatcherStopped, QueueFull
from app.errors import (
    ERRORS,
    MAX_MESSAGE_CHARS,
    BadRequest,
    Forbidden,
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    NotReady,
    PayloadTooLarge,
    RequestTimeout,
    ServiceError,
    Unauthorized,
    UnsupportedMediaType,
    clip,
    translate,
)
from app.observability.request_context import REQUEST_ID, REQUEST_ID_SCOPE_KEY, log_unexpected
from calibration_store.base import NoPreviousVersion as StoreNoPreviousVersion
from calibration_store.base import ProfileNotFound as StoreProfileNotFound
from calibration_store.base import StoreCorrupt as StoreDocumentCorrupt
from calibration_store.base import StoreUnavailable as StoreDown

_BY_STATUS: dict[int, type[ServiceError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    408: RequestTimeout,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    422: InvalidRequest,
    503: NotReady,
}
"""Our error for an HTTPException raised by routing, the body guard or a dependency."""


def status_of(error: ServiceError) -> int:
    return type(error).status


_STATUS_OF: dict[str, int] = {cls.code: cls.status for cls in ERRORS}
"""Each code's HTTP status (a code outside the table is a 500)."""

ERROR_TYPES: dict[int, str] = {
    401: "authentication_error",
    403: "permission_error",
    429: "rate_limit_error",
}
"""OpenAI's error class by HTTP status (``error.type``; vLLM answers in OpenAI's shape):
these, else ``invalid_request_error`` for a 4xx and ``server_error`` for a 5xx."""


def error_type(status: int) -> str:
    """``error.type`` of an answer with HTTP ``status``."""
    return ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_body(
    code: str, message: str, request_id: str | None = None, status: int | None = None
) -> dict[str, Any]:
    """The one error envelope: ours under ``error`` (code, message, type, request_id), the
    message again where other rerank APIs' clients look for it: ``message`` (Cohere's
    SDK), ``detail`` (Jina's clients, LlamaIndex's JinaRerank; FastAPI's shape: on 422 a
    list of one ``{"loc", "msg", "type"}`` item, which Infinity's client parses).
    ``status`` defaults to the code's own (the error table)."""
    message = clip(message, MAX_MESSAGE_CHARS)
    status = status if status is not None else _STATUS_OF.get(code, 500)
    detail: str | list[dict[str, Any]] = message
    if status == 422:
        detail = [{"loc": ["body"], "msg": message, "type": code}]
    return {
        "error": {
            "code": code,
            "message": message,
            "type": error_type(status),
            "request_id": request_id,
        },
        "message": message,
        "detail": detail,
    }


def error_response(
    error: ServiceError, request_id: str | None = None, status: int | None = None
) -> JSONResponse:
    """The answer for ``error`` (``status``: its own unless given)."""
    headers = dict(error.headers)
    if request_id:
        headers.setdefault("X-Request-ID", request_id)
    status = status if status is not None else status_of(error)
    return JSONResponse(
        error_body(error.code, error.message, request_id, status),
        status_code=status,
        headers=headers,
    )


def _request_id(request: Request) -> str | None:
    return request.scope.get(REQUEST_ID_SCOPE_KEY) or REQUEST_ID.get()


def _validation_message(exc: RequestValidationError) -> str:
    """'body.images.0: Input should be a valid string; ...' (first five problems)."""
    parts = []
    for err in exc.errors()[:5]:
        where = clip(".".join(clip(p) for p in err.get("loc", ())))
        msg = clip(err.get("msg", "invalid"))
        parts.append(f"{where}: {msg}" if where else msg)
    more = len(exc.errors()) - 5
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def unexpected_error_response(exc: BaseException, method: str, path: str) -> JSONResponse:
    """The 500 answer for an exception nothing else handled (logged once, compactly)."""
    log_unexpected(exc, f"unexpected error on {method} {path}")
    return error_response(
        InternalError("internal error; the server log has the details under this request_id"),
        REQUEST_ID.get(),
    )


def _allowed_methods(request: Request) -> list[str]:
    """Every method of every documented route on this path (several routes may share it)."""
    path = request.url.path
    methods: set[str] = set()
    for template, operations in request.app.openapi().get("paths", {}).items():
        pattern = re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template))
        if re.fullmatch(pattern, path):
            methods.update(m.upper() for m in operations)
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)


def install_error_handlers(app: FastAPI) -> None:
    """Route known exceptions to the common envelope. Unknown ones are caught by the request
    middleware (``unexpected_error_response``), which, unlike a handler for ``Exception``,
    does not re-raise them into the server: the connection stays usable."""

    async def on_service_error(request: Request, exc: Exception) -> JSONResponse:
        error = translate(exc) or InternalError("unexpected error")
        return error_response(error, _request_id(request))

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(InvalidRequest(_validation_message(exc)), _request_id(request))

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        cls = _BY_STATUS.get(exc.status_code, BadRequest if exc.status_code < 500 else NotReady)
        detail = exc.detail if isinstance(exc.detail, str) and exc.detail else cls.meaning
        error = cls(detail) if cls is not Unauthorized else Unauthorized(detail)
        error.headers.update(exc.headers or {})
        if exc.status_code == 405:  # every method of every route on this path
            allowed = _allowed_methods(request)
            if allowed:
                error.headers["Allow"] = ", ".join(allowed)
                error.message = (
                    f"{clip(request.method)} is not allowed here; use {', '.join(allowed)}"
                )
        elif exc.status_code == 404 and detail == "Not Found":
            error.message = f"no route {clip(request.method)} {clip(request.url.path)}"
        return error_response(error, _request_id(request), exc.status_code)

    for exc_type in (
        ServiceError,
        QueueFull,
        BatcherStopped,
        StoreProfileNotFound,
        StoreNoPreviousVersion,
        StoreDown,
        StoreDocumentCorrupt,
    ):
        app.add_exception_handler(exc_type, on_service_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
