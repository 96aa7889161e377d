"""X-Request-ID: take a sane one from the client or make one, echo it on every response.

The id is left in the ASGI scope under ``app.logs.REQUEST_ID_SCOPE_KEY``, where the request
log (app.metrics' middleware) reads it. Minimal on purpose: the hardening work (issue 10)
also puts the id into error bodies; whichever lands second keeps one of the two.
"""

from __future__ import annotations

import re
import uuid

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.logs import REQUEST_ID_SCOPE_KEY

_SANE_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")


class RequestIdMiddleware:
    """X-Request-ID in (when it is a short token of safe characters), X-Request-ID out."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = Headers(scope=scope).get("x-request-id", "")
        request_id = given if _SANE_ID.fullmatch(given) else uuid.uuid4().hex
        scope[REQUEST_ID_SCOPE_KEY] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                if "x-request-id" not in headers:
                    headers.append("X-Request-ID", request_id)
            await send(message)

        await self.app(scope, receive, send_with_id)
