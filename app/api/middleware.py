"""The request's edge, as pure ASGI middleware: its id, its body limit and read deadline,
and the last-resort answer for an unexpected error.

- ``RequestIdMiddleware`` (outermost): takes a sane ``X-Request-ID`` or makes one, puts it
  in the scope, the log context and every response's headers, and turns any exception
  nothing else handled into the 500 envelope, logged once, compactly. Unlike a Starlette
  handler for ``Exception`` it does not re-raise into the server, which would close the
  keep-alive connection after answering.
  A client that left before its body was sent (``ClientDisconnect``) gets no answer and
  no error line: the metrics middleware counts it as 499.
- ``InFlightLimitMiddleware``: at most LAD_MAX_IN_FLIGHT requests handled at once, a
  request counting from the moment its body has arrived (so slow and idle connections
  never hold a slot), probes and scrapes never; past it 429 ``overloaded``.
- ``BodyGuardMiddleware``: a per-route byte limit (the route table's ``body_limit``),
  counted as the body arrives (chunked bodies too) and refused at once past it (413), and a
  deadline for the whole body (408), so a half-sent body cannot hold a connection. Both
  answers close the connection. A disconnect before the body's end is raised as
  ``ClientDisconnect`` whoever reads it.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
import uuid

from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import errors
from app.api.error_handlers import error_response, unexpected_error_response
from app.api.route_table import PATTERNS, SMALL_BODY_BYTES
from app.budget import ACCOUNT, BODY_COPIES, Account, ByteBudget
from app.observability.request_context import REQUEST_ID, REQUEST_ID_SCOPE_KEY
from app.settings import Settings

_SANE_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")


class RequestIdMiddleware:
    """X-Request-ID in, X-Request-ID out; unexpected errors answered in the envelope."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = Headers(scope=scope).get("x-request-id", "")
        request_id = given if _SANE_ID.fullmatch(given) else uuid.uuid4().hex
        scope[REQUEST_ID_SCOPE_KEY] = request_id
        token = REQUEST_ID.set(request_id)
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = MutableHeaders(scope=message)
                if "x-request-id" not in headers:
                    headers.append("X-Request-ID", request_id)
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except ClientDisconnect:
            pass  # nobody to answer; counted (499) and logged by the metrics middleware
        except Exception as exc:
            response = unexpected_error_response(
                exc, scope.get("method", ""), scope.get("path", "")
            )
            if not started:
                await response(scope, receive, send_with_id)
        finally:
            REQUEST_ID.reset(token)


UNLIMITED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
"""Probes and scrapes: cheap, and they must answer while the service is at its limit."""


def has_body(scope: Scope) -> bool:
    headers = Headers(scope=scope)
    return "transfer-encoding" in headers or headers.get("content-length", "0") != "0"


class InFlightLimitMiddleware:
    """At most ``settings.max_in_flight`` requests handled at once (429 ``overloaded``).

    A request takes its slot when its body has fully arrived (at once when it has none), so
    connections that send nothing, or send their body slowly, are bounded by the connection
    limit and the read deadline, never by this one: they cannot lock real requests out.
    """

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.limit = settings.max_in_flight
        self.active = 0

    def _refusal(self) -> errors.Overloaded:
        return errors.Overloaded(
            f"{self.active} requests are being handled (LAD_MAX_IN_FLIGHT={self.limit}); "
            "retry in 1 s",
            retry_after_s=1,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNLIMITED_PATHS:
            await self.app(scope, receive, send)
            return
        held = False

        def take() -> bool:
            nonlocal held
            if self.active >= self.limit:
                return False
            self.active += 1
            held = True
            return True

        async def counted_receive() -> Message:
            message = await receive()
            body_done = message["type"] == "http.request" and not message.get("more_body")
            if body_done and not held and not take():
                raise self._refusal()
            return message

        if not has_body(scope) and not take():
            request_id = scope.get(REQUEST_ID_SCOPE_KEY)
            await error_response(self._refusal(), request_id)(scope, receive, send)
            return
        try:
            await self.app(scope, counted_receive, send)
        finally:
            if held:
                self.active -= 1


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` when the body passes its limit (answered 413, then closed)."""

    def __init__(self, limit: int, setting: str) -> None:
        super().__init__(
            413, f"the request body is over {limit} bytes ({setting})", {"Connection": "close"}
        )


class BodyTimeout(HTTPException):
    """Raised from ``receive`` when the body misses its deadline or its minimum rate
    (answered 408, then closed)."""

    def __init__(self, why: str) -> None:
        super().__init__(408, f"the request body {why}", {"Connection": "close"})


BodyLimits = tuple[tuple[str, re.Pattern[str], int, str], ...]
"""Each route of the table, in its order: method, the pattern of its concrete paths, its
body byte limit and the setting that names it."""

NO_BODY_SETTING = "fixed for routes without a body"


def body_limits(settings: Settings) -> BodyLimits:
    """Every route's body limit, read from the route table and the settings once (the body
    guard does it when it is built): its ``body_limit``, SMALL_BODY_BYTES for none."""
    return tuple(
        (
            route.method,
            pattern,
            SMALL_BODY_BYTES if route.body_limit is None else getattr(settings, route.body_limit),
            route.limit_setting,
        )
        for route, pattern in PATTERNS
    )


def body_limit(
    settings: Settings, method: str, path: str, limits: BodyLimits | None = None
) -> tuple[int, str]:
    """The byte limit of a request's body and the setting that names it, from ``limits``
    (``body_limits(settings)`` when not given): its route's, SMALL_BODY_BYTES for a path
    no route serves."""
    for route_method, pattern, limit, setting in limits or body_limits(settings):
        if route_method == method and pattern.fullmatch(path):
            return limit, setting
    return SMALL_BODY_BYTES, NO_BODY_SETTING


class BodyGuardMiddleware:
    """Per-route body limit counted as bytes arrive, a deadline and a minimum rate for the
    whole body, and the request's budget account: the body charged before it is read
    (declared) or as it arrives (chunked), the answer until it is written."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self.limits = body_limits(settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, setting = body_limit(self.settings, scope["method"], scope["path"], self.limits)
        length = Headers(scope=scope).get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            error = errors.PayloadTooLarge(
                f"the request body has {length} bytes; the limit is {limit} ({setting})",
                headers={"Connection": "close"},
            )
            await error_response(error, scope.get(REQUEST_ID_SCOPE_KEY))(scope, receive, send)
            return
        budget = _budget(scope)
        account = Account(budget) if budget is not None else None
        declared = int(length) if length is not None and length.isdigit() else None
        if account is not None and declared is not None and declared > SMALL_BODY_BYTES:
            try:  # before the body is read: a waiting body stays in the socket
                await account.admit(declared * BODY_COPIES, "the request body")
            except errors.ServiceError as refused:
                request_id = scope.get(REQUEST_ID_SCOPE_KEY)
                await error_response(refused, request_id)(scope, receive, send)
                return
        pace = Pace(self.settings)
        received = 0
        finished = False

        async def guarded_receive() -> Message:
            nonlocal received, finished
            if finished:  # after the body: waiting for a disconnect is not bounded
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), pace.left(received))
            except TimeoutError:
                raise BodyTimeout(pace.why(received)) from None
            if message["type"] == "http.request":
                chunk = len(message.get("body", b""))
                received += chunk
                if received > limit:
                    raise BodyTooLarge(limit, setting)
                finished = not message.get("more_body", False)
                if account is not None and declared is None and received > SMALL_BODY_BYTES:
                    await account.admit(chunk * BODY_COPIES, "the request body")
            else:  # the client left before the end of its body
                finished = True
                raise ClientDisconnect()
            return message

        answer = AnswerWriter(send, account, self.settings)
        token = ACCOUNT.set(account)
        try:
            await self.app(scope, guarded_receive, answer.send)
        finally:
            ACCOUNT.reset(token)
            if account is not None:
                account.close()


class Pace:
    """A transfer's deadlines: all of it within LAD_READ_TIMEOUT_S, and after
    LAD_TRANSFER_GRACE_S at least LAD_MIN_TRANSFER_BYTES_PER_S on average (0: no minimum),
    so that a client declaring a large body and trickling it cannot hold its reservation
    for the whole read timeout (issue 41: 192 MiB held 29 s by 64 KiB/s)."""

    def __init__(self, settings: Settings, total_s: float | None = None) -> None:
        self.start = time.monotonic()
        self.total_s = settings.read_timeout_s if total_s is None else total_s
        self.rate = settings.min_transfer_bytes_per_s
        self.grace_s = settings.transfer_grace_s

    def left(self, done: int) -> float:
        """Seconds until the next byte is due, ``done`` bytes being through."""
        due = self.start + self.total_s
        if self.rate > 0:
            due = min(due, self.start + self.grace_s + done / self.rate)
        return max(0.0, due - time.monotonic())

    def timeout(self, done: int) -> float | None:
        """``left`` for ``asyncio.wait_for`` (None: no deadline at all)."""
        left = self.left(done)
        return None if math.isinf(left) else max(left, 0.001)

    def why(self, done: int) -> str:
        elapsed = time.monotonic() - self.start
        if elapsed >= self.total_s:
            return f"did not arrive within {self.total_s:g} s (LAD_READ_TIMEOUT_S)"
        return (
            f"arrived at {done / max(elapsed, 1e-9):.0f} bytes/s, below "
            f"LAD_MIN_TRANSFER_BYTES_PER_S={self.rate} after LAD_TRANSFER_GRACE_S="
            f"{self.grace_s:g}"
        )


ANSWER_CHUNK_BYTES = 256 * 1024
"""A large answer is written in pieces of this size: the server waits for each to drain
before the next, so the answer stays charged to its request until the client has it."""


def _sooner(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


class AnswerStalled(ClientDisconnect):
    """The client does not read its answer at the minimum rate: treated as gone (499)."""


class AnswerWriter:
    """``send`` for one request: an answer larger than what the request holds is charged
    (before it starts, so a refusal can still be answered), and a large answer is written
    in pieces, each within the transfer's pace; the request's account is closed only after
    the last piece, so an answer the client does not read stays counted (issue 41: six
    unread 45 MB rerank echoes held +243 MiB with the gauge at 0)."""

    def __init__(self, send: Send, account: Account | None, settings: Settings) -> None:
        self._send = send
        self.account = account
        self.settings = settings

    async def send(self, message: Message) -> None:
        if self.account is None:
            await self._send(message)
            return
        if message["type"] == "http.response.start":
            size = Headers(raw=message.get("headers", [])).get("content-length", "")
            extra = int(size) - self.account.held if size.isdigit() else 0
            if int(size or 0) > SMALL_BODY_BYTES and extra > 0:
                await self.account.agrow(extra, "the answer")
            await self._send(message)
            return
        body = message.get("body", b"")
        if message["type"] != "http.response.body" or len(body) <= ANSWER_CHUNK_BYTES:
            await self._send(message)
            return
        pace = Pace(self.settings, total_s=float("inf"))
        more = message.get("more_body", False)
        view = memoryview(body)
        for at in range(0, len(body), ANSWER_CHUNK_BYTES):
            piece = bytes(view[at : at + ANSWER_CHUNK_BYTES])
            last = at + ANSWER_CHUNK_BYTES >= len(body)
            piece_message = {"type": "http.response.body", "body": piece}
            piece_message["more_body"] = more if last else True
            left = pace.timeout(at)  # the average rate, and no piece stalled past the grace
            stall = (
                self.settings.transfer_grace_s if self.settings.min_transfer_bytes_per_s else None
            )
            try:
                await asyncio.wait_for(self._send(piece_message), _sooner(left, stall))
            except TimeoutError:
                raise AnswerStalled() from None


def _budget(scope: Scope) -> ByteBudget | None:
    """The replica's in-flight byte budget (None before the service started)."""
    service = getattr(getattr(scope.get("app"), "state", None), "service", None)
    return getattr(service, "budget", None)
