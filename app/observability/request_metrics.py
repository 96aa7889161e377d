"""The request middleware of the metrics: per request the counts, latency, in-flight gauge
and errors by code of ``metrics``, and the request's log line (``logs``)."""

from __future__ import annotations

import json
import time

from starlette.datastructures import MutableHeaders
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.observability import logs, tracing
from app.observability.metrics import CLIENT_CLOSED_CODE, CLIENT_CLOSED_STATUS, Metrics
from app.observability.request_context import REQUEST_ID_SCOPE_KEY

QUIET_PATHS = frozenset({"/metrics", "/healthz", "/readyz"})
"""Scrapes and probes: counted, but not in flight, and in the request log only when they
fail (status >= 400) or at debug level: a probe every few seconds would bury the log."""
_MAX_ERROR_BODY = 64 * 1024
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"})
"""The verbs counted by name; any other (a client may send 60 KB of letters) is "other",
so a client cannot add a label value, and a time series, per request."""


def _error_code(body: bytes) -> str | None:
    """The ``code`` of an error envelope (None when the body is not one)."""
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    return code if isinstance(code, str) else None


class RequestMetricsMiddleware:
    """Per request: counts and latency by route template (not raw path), HTTP verb, status
    (499 for a client that left before its body was read) and retrieval method; the
    in-flight gauge; errors by code (read from the error envelope); the request's log line
    (``app.observability.logs``; for QUIET_PATHS only on failure or at debug level); its
    trace span when tracing is on (``app.observability.tracing``; never for QUIET_PATHS); and
    a ``Server-Timing: app;dur=<ms>`` response header (the time until the answer starts)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        quiet = scope.get("path") in QUIET_PATHS
        record = logs.RequestRecord(
            request_id=scope.get(REQUEST_ID_SCOPE_KEY), http_method=scope.get("method", "")
        )
        error_body = bytearray()

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = int(message["status"])
                # the service's own time up to its answer, for clients and benchmarks
                # (W3C Server-Timing; browsers' developer tools show it)
                elapsed_ms = (time.perf_counter() - started) * 1e3
                MutableHeaders(scope=message).append("Server-Timing", f"app;dur={elapsed_ms:.3f}")
            elif message["type"] == "http.response.body" and record.status >= 400:
                room = _MAX_ERROR_BODY - len(error_body)
                error_body.extend(message.get("body", b"")[: max(room, 0)])
            await send(message)

        if not quiet:
            self.metrics.in_flight.inc()
        span = None if quiet else tracing.start_request(scope, record.request_id)
        try:
            with logs.request_scope(record):
                await self.app(scope, receive, send_wrapper)
        except ClientDisconnect:
            record.status, record.error_code = CLIENT_CLOSED_STATUS, CLIENT_CLOSED_CODE
            raise
        except BaseException:
            record.status = record.status or 500
            record.error_code = record.error_code or "internal_error"
            raise
        finally:
            if not quiet:
                self.metrics.in_flight.dec()
            self._finish(scope, record, bytes(error_body), started, quiet)
            tracing.end_request(span, record)

    def _finish(
        self,
        scope: Scope,
        record: logs.RequestRecord,
        error_body: bytes,
        started: float,
        quiet: bool,
    ) -> None:
        record.status = record.status or 500
        record.route = getattr(scope.get("route"), "path", None) or "unmatched"
        record.latency_ms = round((time.perf_counter() - started) * 1e3, 2)
        if record.status >= 400 and record.error_code is None:
            record.error_code = _error_code(error_body) or "http_error"
        method = (record.method or "") if record.route == "/v1/retrieve" else ""
        self.metrics.observe_request(
            record.route,
            record.http_method if record.http_method in HTTP_METHODS else "other",
            record.status,
            record.latency_ms / 1e3,
            method,
            record.error_code,
        )
        logs.log_request(record, probe=quiet)
