"""uvicorn as `lad serve` runs it: the server's own deadlines, connection bound and framing.

uvicorn's ``limit_concurrency`` counts open connections together with running requests, so
300 sockets that send nothing lock every real request out (plain-text 503). It is off here;
instead ``GuardedH11Protocol``

- bounds open connections (``LAD_MAX_CONNECTIONS``): past it the connection idle for the
  longest (no request under way: waiting for its first head, a trickled head or in
  keep-alive; for ``FRESH_S`` or more) is closed to make room, else the upload stalled the
  longest (no body bytes for ``FRESH_S`` or more), else whichever idle or uploading one has
  been quiet the longest (an upload still receiving bytes goes after every quieter one);
  only when every connection has a request being answered is the new one closed;
- closes a connection whose request head does not arrive within ``LAD_HEADER_TIMEOUT_S``
  (from the connection's start, or from the first byte of a keep-alive request);
- refuses (400, then closes) a request framed by both Content-Length and
  Transfer-Encoding (RFC 9112 §6.3: the two readings of its body are how a request is
  smuggled), and a request line + headers over ``MAX_HEAD_BYTES`` (431) even when they
  arrive complete in one read, which h11's own bound (an unfinished head) lets through;
- answers these protocol-level refusals, and h11's own, in the error envelope;
- at the drain (SIGTERM), closes every upload stalled for ``FRESH_S`` (its request sees a
  disconnect: 499 at info, like a client that left) at once and an upload that stalls
  later as soon as it has been quiet that long, so stalled bodies never hold the drain
  until its bound (where uvicorn would cancel them: a plain-text 500); uploads still
  receiving bytes and requests being answered finish.

Requests in flight are bounded by the app (``app.api.middleware.InFlightLimitMiddleware``),
idle keep-alive connections by ``timeout_keep_alive``; the body's deadline is the body
guard's (LAD_READ_TIMEOUT_S). What only an ingress in front can add: deploy/EDGE.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from app import errors
from app.api.error_handlers import error_body
from app.settings import Settings

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024
"""Request line + headers of one request, counted as name and value bytes (431 past it)."""
FRESH_S = 1.0
"""A connection idle for less than this may just not have sent its head yet: at the
connection bound it is closed only after every older idle one and every upload."""


def head_bytes(request: h11.Request) -> int:
    """Bytes of a request's line and headers as h11 parsed them (separators included)."""
    line = len(request.method) + len(request.target) + len(b" HTTP/1.1\r\n") + 1
    return line + sum(len(name) + len(value) + 4 for name, value in request.headers)


class StrictH11Connection(h11.Connection):
    """h11's server side, stricter where h11 is lenient, and remembering why it refused.

    h11 lets Transfer-Encoding win over Content-Length (RFC 9112 allows it, and asks that
    the connection then be closed) and bounds only an *unfinished* head; here both are a
    ``RemoteProtocolError``, which uvicorn answers with ``send_400_response`` and a close.
    """

    def __init__(self, max_head_bytes: int) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=max_head_bytes)
        self.max_head_bytes = max_head_bytes
        self.refusal: h11.RemoteProtocolError | None = None

    def next_event(self) -> Any:
        try:
            event = super().next_event()
            if isinstance(event, h11.Request):
                self._check(event)
            return event
        except h11.RemoteProtocolError as exc:
            self.refusal = exc
            raise

    def _check(self, request: h11.Request) -> None:
        names = {name for name, _ in request.headers}
        if b"content-length" in names and b"transfer-encoding" in names:
            raise h11.RemoteProtocolError(
                "the request has both Content-Length and Transfer-Encoding (RFC 9112 "
                "section 6.3); send one of them"
            )
        size = head_bytes(request)
        if size > self.max_head_bytes:
            raise h11.RemoteProtocolError(
                f"the request line and headers have {size} bytes; the limit is "
                f"{self.max_head_bytes}",
                error_status_hint=431,
            )


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a connection bound, a head deadline, strict framing and
    protocol errors in the envelope (see the module docstring)."""

    header_timeout_s: float = 10.0
    max_connections: int = 1024
    max_head_bytes: int = MAX_HEAD_BYTES
    _last_warning: float = float("-inf")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = StrictH11Connection(self.max_head_bytes)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self.idle_since = self.loop.time()
        self.bytes_at = self.idle_since
        self._arm_header_timer()
        if len(self.connections) > self.max_connections:
            self._make_room()

    def data_received(self, data: bytes) -> None:
        self.bytes_at = self.loop.time()
        super().data_received(data)
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self._arm_header_timer()  # bytes of a request whose headers are incomplete
        else:
            self._cancel_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        self.idle_since = self.loop.time()
        super().on_response_complete()

    # ------------------------------------------------------------------ connection bound
    def is_idle(self) -> bool:
        """No request under way: no head yet (or part of one), or between keep-alive requests."""
        return (
            not self.transport.is_closing()
            and self.conn.their_state is h11.IDLE
            and (self.cycle is None or self.cycle.response_complete)
        )

    def is_uploading(self) -> bool:
        """A request whose body is still arriving (not yet handed to the model)."""
        return not self.transport.is_closing() and self.conn.their_state is h11.SEND_BODY

    def quiet_since(self) -> float:
        """Since when this connection has made no progress: an idle one since it opened or
        its last answer (a trickled head is no progress), an upload since its last bytes."""
        return self.bytes_at if self.is_uploading() else self.idle_since

    def _make_room(self) -> None:
        """Close the longest-idle connection idle for FRESH_S or more; else the upload
        stalled longest for FRESH_S or more (its request sees a disconnect: 499); else the
        quietest of the rest, idle or uploading: an upload whose bytes are still arriving
        (a client's ordinary request, between its head and its body) goes after every
        connection that is quieter; else, all being answered, this one."""
        now = self.loop.time()
        others = [
            c for c in self.connections if c is not self and isinstance(c, GuardedH11Protocol)
        ]
        quiet = [c for c in others if c.is_idle() or c.is_uploading()]
        stale = [c for c in quiet if now - c.quiet_since() >= FRESH_S]
        for kind, candidates in (
            ("idle", [c for c in stale if c.is_idle()]),
            ("stalled uploading", [c for c in stale if c.is_uploading()]),
            ("fresh", quiet),
        ):
            if candidates:
                if kind != "idle":
                    self._warn(f"closed the quietest {kind} connection to make room")
                min(candidates, key=GuardedH11Protocol.quiet_since).transport.close()
                return
        self._warn("refused a connection: every other one has a request being answered")
        self.transport.close()

    def _warn(self, what: str) -> None:
        """At most one line per 10 s: a flood of connections must not flood the log."""
        now = self.loop.time()
        if now - GuardedH11Protocol._last_warning >= 10.0:
            GuardedH11Protocol._last_warning = now
            log.warning(
                "%s (%d open, LAD_MAX_CONNECTIONS=%d)",
                what,
                len(self.connections),
                self.max_connections,
            )

    # ------------------------------------------------------------------ drain
    def shutdown(self) -> None:
        """uvicorn's start of the drain for this connection, plus: a stalled upload is
        closed (see :meth:`_close_if_stalled`)."""
        super().shutdown()
        if self.is_uploading():
            self._close_if_stalled()

    def _close_if_stalled(self) -> None:
        """Close this upload once it has sent nothing for ``FRESH_S`` (its request sees a
        disconnect, counted and logged as 499); look again when it may have."""
        if not self.is_uploading():
            return
        quiet = self.loop.time() - self.bytes_at
        if quiet >= FRESH_S:
            log.info("draining: closed an upload stalled for %.1f s", quiet)
            self.transport.close()
        else:
            self.loop.call_later(FRESH_S - quiet, self._close_if_stalled)

    # ------------------------------------------------------------------ head deadline
    def _arm_header_timer(self) -> None:
        if getattr(self, "_header_timer", None) is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _cancel_header_timer(self) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()

    # ------------------------------------------------------------------ protocol errors
    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a ``RemoteProtocolError``, in the envelope: 400 (431 for a
        head over the limit), a fresh request id, then the connection is closed."""
        refusal = getattr(self.conn, "refusal", None)
        too_large = getattr(refusal, "error_status_hint", 400) == 431
        error = errors.HeadersTooLarge if too_large else errors.BadRequest
        status = error.status  # one status per code (h11's 501 for a coding is a 400 here)
        detail = str(refusal) if refusal is not None and str(refusal) else msg
        if too_large and "limit" not in detail:  # h11's own: an unfinished head past its bound
            detail = f"the request line and headers are over {self.max_head_bytes} bytes"
        request_id = uuid.uuid4().hex
        log.info(
            "refused a malformed HTTP request with %d (request_id=%s): %s",
            status,
            request_id,
            detail,
        )
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the running request, if any, sees a disconnect
            self.cycle.message_event.set()
        if self.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            self.transport.close()  # an answer is already under way: closing is all that is left
            return
        body = json.dumps(
            error_body(error.code, f"malformed HTTP request: {detail}", request_id)
        ).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
            (b"x-request-id", request_id.encode()),
        ]
        try:
            for event in (
                h11.Response(status_code=status, headers=headers),
                h11.Data(data=body),
                h11.EndOfMessage(),
            ):
                self.transport.write(self.conn.send(event))
        except h11.LocalProtocolError:
            pass  # h11 will not frame an answer in this state: the close below is the answer
        self.transport.close()


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """The server's own limits as ``uvicorn.Config`` arguments (docs/configuration.md):
    connection bound, head deadline and size, keep-alive; ``app.serve`` adds host, port and
    logs. No ``limit_concurrency``: it counts idle connections as load (module docstring)."""
    protocol = type(
        "LadH11Protocol",
        (GuardedH11Protocol,),
        {
            "header_timeout_s": settings.header_timeout_s,
            "max_connections": settings.max_connections,
        },
    )
    return {
        "http": protocol,
        "timeout_keep_alive": settings.keep_alive_s,
        "h11_max_incomplete_event_size": MAX_HEAD_BYTES,
    }
