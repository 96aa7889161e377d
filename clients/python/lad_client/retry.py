"""What a failed call means for the caller: the service's error as an exception, and when
(and how often) a call is worth sending again."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

import httpx

RETRY_STATUSES = frozenset({429, 503})
"""Queue full (429); not ready or store down (503): both pass, so both are retried."""


class LadError(RuntimeError):
    """An error answer of the service: HTTP status, error code, message, and when to retry."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        retry_after_s: float | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message
        self.retry_after_s, self.request_id = retry_after_s, request_id


class LadConnectionError(LadError):
    """No answer from the service: the connection was refused (after the retries), timed
    out or broke. ``status`` is 0 (no HTTP status); ``code`` is ``connection_failed`` or
    ``timeout``; the httpx error is the ``__cause__``."""


def connection_error(exc: httpx.TransportError, method: str, url: str) -> LadConnectionError:
    """The :class:`LadConnectionError` of a transport failure of ``method url``."""
    code = "timeout" if isinstance(exc, httpx.TimeoutException) else "connection_failed"
    return LadConnectionError(0, code, f"{method} {url}: {type(exc).__name__}: {exc}")


def retry_after_s(response: httpx.Response) -> float | None:
    """``Retry-After`` in seconds (delta-seconds or an HTTP date), None if absent."""
    value = response.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def error_of(response: httpx.Response) -> LadError:
    """The error envelope of an answer as a LadError (any body: a proxy's page included)."""
    try:
        error = response.json()["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        code, message = "http_error", response.text[:500]
    return LadError(
        response.status_code,
        code,
        message,
        retry_after_s(response),
        response.headers.get("X-Request-ID"),
    )


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to wait: attempt k waits max(Retry-After, base * 2^k) plus up
    to 10 % jitter, at most ``max_wait_s``; ``retries`` = 0 turns retrying off."""

    retries: int = 3
    base_s: float = 0.5
    max_wait_s: float = 30.0

    def wait_s(self, attempt: int, retry_after: float | None) -> float:
        backoff = self.base_s * (2**attempt)
        wait = max(backoff, retry_after or 0.0)
        return min(self.max_wait_s, wait * (1 + 0.1 * random.random()))
