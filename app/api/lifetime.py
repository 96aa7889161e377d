"""Requests nobody waits for any more: the client went away, or its deadline passed.

Without this a request whose client disconnected ran to its end: five ``perm_avg``
requests whose clients left after 0.07 s ran 52 forward passes for nobody and pushed the
next three real requests into 429s (issue 41). Here, once the body has arrived, the
connection is watched for ``http.disconnect``; when it comes the request's task is
cancelled, which cancels its queued forward passes (the batcher drops them from its queue
at once and never runs a cancelled one) and closes its byte-budget account. A request may
also say how long it is willing to wait, ``X-Request-Timeout: <seconds>`` (counted from
its arrival, upload included): past it, before its answer has started, its work is
dropped the same way and it is answered 504 ``deadline_exceeded``. Both are counted
(``lad_requests_abandoned_total{stage}``, ``lad_requests_deadline_exceeded_total``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import time

from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import errors
from app.api.error_handlers import error_response
from app.observability.metrics import Metrics
from app.observability.request_context import REQUEST_ID_SCOPE_KEY, STAGE, RequestStage
from lad_client.routes import find

COLLECT_EVERY_S = 2.0
"""At most one cyclic collection per this many seconds after dropped requests."""
_last_collect = float("-inf")


def collect_dropped() -> None:
    """Free what a dropped request left in reference cycles, now, not at the cyclic GC's
    next full pass: its exception's traceback holds the frames that hold its body and its
    answer (six dropped 48 MB rerank echoes kept +555 MiB, in cycles, until then; one
    ``gc.collect`` gave them back). Rate-limited: a client cannot make it run often."""
    global _last_collect
    now = time.monotonic()
    if now - _last_collect >= COLLECT_EVERY_S:
        _last_collect = now
        gc.collect()


DEADLINE_HEADER = "x-request-timeout"
MAX_DEADLINE_S = 86_400.0
"""The longest deadline accepted (a day); a longer one is refused 422 like a malformed one."""
UNWATCHED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


def deadline_s(scope: Scope) -> float | None:
    """The request's ``X-Request-Timeout`` in seconds (None: none sent, or a route that
    does not take one: the route table lists ``deadline_exceeded`` for those that do);
    422 when it is not a finite number of seconds in (0, MAX_DEADLINE_S]."""
    raw = Headers(scope=scope).get(DEADLINE_HEADER)
    route = find(scope.get("method", ""), scope.get("path", ""))
    if raw is None or route is None or "deadline_exceeded" not in route.errors:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        value = math.nan
    if not (0 < value <= MAX_DEADLINE_S):  # NaN fails too
        raise errors.InvalidRequest(
            f"X-Request-Timeout must be a number of seconds in (0, {MAX_DEADLINE_S:g}]; "
            f"got {errors.clip(raw)!r}"
        )
    return value


class RequestLifetimeMiddleware:
    """Cancels a request whose client disconnected, or whose X-Request-Timeout passed."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNWATCHED_PATHS:
            await self.app(scope, receive, send)
            return
        arrived = time.monotonic()
        try:
            timeout = deadline_s(scope)
        except errors.InvalidRequest as refused:
            request_id = scope.get(REQUEST_ID_SCOPE_KEY)
            await error_response(refused, request_id)(scope, receive, send)
            return
        stage = RequestStage("body")
        body_done, gone = asyncio.Event(), asyncio.Event()
        started = answered = False

        async def tracked_receive() -> Message:
            if body_done.is_set():  # after the body the watcher reads the connection
                await gone.wait()
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                body_done.set()
                stage.value = "work"
            elif message["type"] == "http.disconnect":
                gone.set()
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started, answered
            if message["type"] == "http.response.start":
                started = True
                stage.value = "answer"
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                answered = True  # a disconnect from now on is the connection's normal end

        async def watch() -> None:
            await body_done.wait()
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        token = STAGE.set(stage)
        try:
            work = asyncio.create_task(self.app(scope, tracked_receive, tracked_send))
        finally:
            STAGE.reset(token)
        watcher = asyncio.create_task(watch())
        gone_wait = asyncio.create_task(gone.wait())
        try:
            while not work.done():
                left = None
                if timeout is not None and not started:  # once answering, no deadline
                    left = timeout - (time.monotonic() - arrived)
                await asyncio.wait(
                    {work, gone_wait}, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                if work.done() or answered:
                    break
                if gone.is_set() or not started:
                    await self._drop(work, stage, scope, send, timeout, gone, body_done)
                    return
            if not work.done():  # answered: what is left of it (cleanup) runs to its end
                await asyncio.wait({work})
            exc = None if work.cancelled() else work.exception()
            if isinstance(exc, ClientDisconnect):  # it left during its upload or its answer
                self.metrics.requests_abandoned.labels(stage=stage.value).inc()
                asyncio.get_running_loop().call_soon(collect_dropped)
            work.result()  # its own exception, if any, goes on to the outer layers
        finally:
            for task in (watcher, gone_wait, work):
                task.cancel()
            # a traceback through this frame keeps its locals: the task would keep its
            # exception and the exception this frame (a cycle only the cyclic GC frees,
            # holding the request's body and answer: +555 MiB after six dropped answers)
            work = watcher = gone_wait = exc = None  # type: ignore[assignment]

    async def _drop(
        self,
        work: asyncio.Task,
        stage: RequestStage,
        scope: Scope,
        send: Send,
        timeout: float | None,
        gone: asyncio.Event,
        body_done: asyncio.Event,
    ) -> None:
        """Cancel the request's work (its queued passes leave the queue, its budget account
        closes); nobody to answer when the client left, else 504 ``deadline_exceeded``."""
        where = stage.value
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError, ClientDisconnect):
            await work
        del work  # the cancelled task (and its CancelledError's frames) must not outlive this
        asyncio.get_running_loop().call_soon(collect_dropped)
        if gone.is_set():
            self.metrics.requests_abandoned.labels(stage=where).inc()
            raise ClientDisconnect()  # nobody to answer: counted 499 by the metrics layer
        self.metrics.requests_deadline_exceeded.inc()
        error = errors.DeadlineExceeded(
            f"X-Request-Timeout={timeout:g} s passed before the answer was ready "
            f"(it was at its {where} stage); the work was dropped",
            headers={} if body_done.is_set() else {"Connection": "close"},
        )
        request_id = scope.get(REQUEST_ID_SCOPE_KEY)

        async def nothing() -> Message:
            return {"type": "http.disconnect"}

        await error_response(error, request_id)(scope, nothing, send)
