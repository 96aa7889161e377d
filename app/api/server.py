"""uvicorn as `lad serve` runs it: the server's own timeouts and connection limit.

uvicorn bounds idle keep-alive connections (``timeout_keep_alive``) and the number of
connections + running requests (``limit_concurrency``, answered 503 beyond it), but not the
time a client may take to send a request's headers: a connection that trickles a partial
request line would be held forever. ``HeaderTimeoutH11Protocol`` closes it after
``LAD_HEADER_TIMEOUT_S``. The body's own deadline is the body guard's (LAD_READ_TIMEOUT_S).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from app.settings import Settings

log = logging.getLogger(__name__)

_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 1 << 20


def return_large_buffers_to_the_os() -> bool:
    """Serve every allocation of 1 MiB or more (decoded images, tensors) from its own
    mapping, returned to the OS when freed.

    glibc raises its mmap threshold to the size of the largest block freed (up to 32 MiB),
    after which decoded images come from heap arenas that are rarely trimmed: a process
    that once decoded big images kept hundreds of MiB. Fixing the threshold turns that off.
    Returns False (and changes nothing) where the C library is not glibc.
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):
        log.info("not glibc: the allocator is left as it is")
        return False


class HeaderTimeoutH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, closing connections whose request headers do not arrive in
    time (from the connection's start, or from the first byte of a keep-alive request)."""

    header_timeout_s: float = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self._arm_header_timer()  # bytes of a request whose headers are incomplete
        else:
            self._cancel_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

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


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """The server's own limits as ``uvicorn.Config`` arguments (documented in the README):
    header deadline, keep-alive, connection limit; ``app.serve`` adds host, port and logs."""
    protocol = type(
        "LadH11Protocol", (HeaderTimeoutH11Protocol,),
        {"header_timeout_s": settings.header_timeout_s},
    )  # fmt: skip
    return {
        "http": protocol,
        "timeout_keep_alive": settings.keep_alive_s,
        "limit_concurrency": settings.max_connections,
        "h11_max_incomplete_event_size": 64 * 1024,
    }
