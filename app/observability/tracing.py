"""OpenTelemetry traces: one span per HTTP request, one child per pipeline stage, exported
over OTLP/HTTP when the operator names a collector, and nothing at all otherwise.

On when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set
(and neither ``OTEL_SDK_DISABLED=true`` nor ``OTEL_TRACES_EXPORTER=none``). Everything
else the SDK reads from the standard ``OTEL_*`` variables itself: the service name and
resource attributes, the exporter's headers, timeout, compression and certificate, the
sampler, the batch processor's limits. Off, no SDK is imported, no thread started, and
the hooks below return at their first line, so the request path pays one global read.

The process holds one tracer (``setup`` at start-up, ``shutdown`` at stop, which flushes
what is buffered). ``start_request`` / ``end_request`` bracket a request (the request
middleware calls them); ``stage_span`` opens a stage's child span where the stage is
timed (``app.service.pipeline.stage``), so spans and ``timings_ms`` name the same stages;
``note_batches`` records the batches a request's instances rode in (``ModelWorker.run``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.datastructures import Headers
from starlette.types import Scope

from app import __version__

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from app.observability.logs import RequestRecord

log = logging.getLogger(__name__)

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
"""Either one turns tracing on (the first, when set, is the traces endpoint as is; the
second gets ``/v1/traces`` appended, as the OTLP specification says)."""
SERVICE_NAME = "lad-serve"
"""``service.name`` unless ``OTEL_SERVICE_NAME`` (or ``OTEL_RESOURCE_ATTRIBUTES``) names one."""
FLUSH_TIMEOUT_S = 5.0
"""Most seconds the service's stop waits for the buffered spans to leave."""
MAX_BATCHES = 64
"""Most batch ids one span lists (a calibration's waves may run in hundreds); the count
attribute has them all."""
RECORD_ATTRIBUTES = ("method", "requested_method", "n", "profile", "version", "token")
"""The request record's fields (``app.observability.logs``) a request span carries as
``lad.<field>``, when the request set them."""


@dataclass
class _Tracing:
    provider: TracerProvider
    tracer: trace.Tracer


_ACTIVE: _Tracing | None = None
_OFF: AbstractContextManager[Any] = nullcontext()  # reusable: no allocation per stage when off


@dataclass
class RequestSpan:
    """One traced request: its span, the OTel context it made current, and its batches."""

    span: trace.Span
    batches: dict[int, int] = field(default_factory=dict)  # batch id -> batch size
    tokens: tuple[object, Token[RequestSpan | None]] | None = None  # to restore at its end


_REQUEST: ContextVar[RequestSpan | None] = ContextVar("lad_request_span", default=None)


def wanted(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Whether the standard variables ask for OTLP trace export."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = {e.strip().lower() for e in environ.get("OTEL_TRACES_EXPORTER", "").split(",")}
    if "none" in exporters:
        return False
    return any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def enabled() -> bool:
    return _ACTIVE is not None


def setup() -> bool:
    """Start the tracer from the environment (idempotent); True when traces are exported."""
    global _ACTIVE
    if _ACTIVE is not None:
        return True
    if not wanted():
        return False
    # the SDK only when asked for: its import and its export thread cost nothing otherwise
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME as SERVICE_NAME_KEY
    from opentelemetry.sdk.resources import SERVICE_VERSION, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = os.environ.get(name, "").strip()
        if protocol and protocol != "http/protobuf":
            log.warning("%s=%s: traces are exported as http/protobuf only", name, protocol)
            break
    detected = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    ours: dict[str, str] = {}
    if str(detected.attributes.get(SERVICE_NAME_KEY, "")).startswith("unknown_service"):
        ours[SERVICE_NAME_KEY] = SERVICE_NAME
    if SERVICE_VERSION not in detected.attributes:
        ours[SERVICE_VERSION] = __version__
    # OTEL_TRACES_SAMPLER; no exit hook of its own: ``shutdown`` bounds the last flush
    provider = TracerProvider(resource=detected.merge(Resource(ours)), shutdown_on_exit=False)
    exporter = OTLPSpanExporter()  # OTEL_EXPORTER_OTLP_* (endpoint, headers, timeout, ...)
    provider.add_span_processor(BatchSpanProcessor(exporter))  # OTEL_BSP_*
    _ACTIVE = _Tracing(provider, provider.get_tracer("lad-serve", __version__))
    named = next(name for name in ENDPOINT_VARIABLES if os.environ.get(name, "").strip())
    where = urlsplit(os.environ[named].strip())  # scheme, host and port: never credentials
    host = where.netloc.rpartition("@")[2]
    log.info("exporting traces over OTLP/HTTP to %s://%s (%s)", where.scheme, host, named)
    return True


def force_flush(timeout_ms: int = 5_000) -> bool:
    """Export what is buffered now (True when it went, or when tracing is off)."""
    return _ACTIVE is None or _ACTIVE.provider.force_flush(timeout_ms)


def shutdown(timeout_s: float = FLUSH_TIMEOUT_S) -> None:
    """Flush and stop the exporter (the service's stop), waiting ``timeout_s`` at most:
    a collector that does not answer (the SDK retries for up to a minute) never holds the
    process's exit. Tracing is off afterwards."""
    global _ACTIVE
    active, _ACTIVE = _ACTIVE, None
    if active is None:
        return
    flush = threading.Thread(target=active.provider.shutdown, name="lad-trace-flush", daemon=True)
    flush.start()
    flush.join(timeout_s)
    if flush.is_alive():
        log.warning("the last traces were not exported within %.0f s; dropped", timeout_s)


# ------------------------------------------------------------------------ requests
def start_request(scope: Scope, request_id: str | None) -> RequestSpan | None:
    """A server span for the request, child of the caller's W3C ``traceparent`` (any
    propagator ``OTEL_PROPAGATORS`` names), made current for the code it runs."""
    if _ACTIVE is None:
        return None
    method = str(scope.get("method", ""))
    parent = propagate.extract(Headers(scope=scope))
    attributes: dict[str, Any] = {"http.request.method": method, "url.path": scope.get("path")}
    if request_id:
        attributes["lad.request_id"] = request_id
    span = _ACTIVE.tracer.start_span(
        method or "HTTP", context=parent, kind=SpanKind.SERVER, attributes=attributes
    )
    request = RequestSpan(span)
    context_token = otel_context.attach(trace.set_span_in_context(span, parent))
    request.tokens = (context_token, _REQUEST.set(request))
    return request


def end_request(request: RequestSpan | None, record: RequestRecord) -> None:
    """Name the span by its route, add what the request did, set an error's status, end it."""
    if request is None:
        return
    span = request.span
    span.update_name(f"{record.http_method} {record.route}")
    span.set_attribute("http.route", record.route)
    span.set_attribute("http.response.status_code", record.status)
    for name in RECORD_ATTRIBUTES:
        value = getattr(record, name)
        if value is not None:
            span.set_attribute(f"lad.{name}", value)
    if record.fallback:
        span.set_attribute("lad.fallback", True)
    _set_batches(span, request.batches)
    if record.status >= 400:
        code = record.error_code or "http_error"
        span.set_attribute("error.type", code)
        span.set_attribute("lad.error_code", code)
        span.set_status(Status(StatusCode.ERROR, code))
    span.end()
    if request.tokens is not None:
        context_token, request_token = request.tokens
        _REQUEST.reset(request_token)
        otel_context.detach(context_token)  # type: ignore[arg-type]


# ------------------------------------------------------------------------ inside one
def stage_span(name: str) -> AbstractContextManager[Any]:
    """A child span of the current request for one pipeline stage (nothing when off)."""
    if _ACTIVE is None:
        return _OFF
    return _ACTIVE.tracer.start_as_current_span(name, attributes={"lad.stage": name})


def note_batches(batches: Iterable[tuple[int, int]]) -> None:
    """The (batch id, batch size) pairs a request's instances rode in, on the current span
    (the run stage's) and, when the request ends, on the request's."""
    request = _REQUEST.get()
    if request is None:
        return
    for batch_id, size in batches:
        request.batches.setdefault(batch_id, size)
    _set_batches(trace.get_current_span(), request.batches)


def _set_batches(span: trace.Span, batches: dict[int, int]) -> None:
    if not batches:
        return
    shown = list(batches.items())[:MAX_BATCHES]
    span.set_attribute("lad.batch.count", len(batches))
    span.set_attribute("lad.batch.ids", [batch_id for batch_id, _ in shown])
    span.set_attribute("lad.batch.sizes", [size for _, size in shown])
