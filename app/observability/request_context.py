"""The request being handled: its id, as a context variable (logs, answers and evidence read
it) and in the ASGI scope; where it is, for the requests that are given up (``work``: its
body read, decoding, waiting for room in the byte budget; ``queue``: its forward passes
queued or running; ``answer``: being written; the lifetime middleware opens one
``RequestStage`` per request, the code that moves a request on marks it, and an abandoned
request is counted by it, ``lad_requests_abandoned_total{stage}``, a bounded label); and the
one log line of a failure nothing else handled."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

log = logging.getLogger("app.errors")
"""The logger of unexpected failures (its name kept: log filters and tests select it)."""

REQUEST_ID: ContextVar[str | None] = ContextVar("lad_request_id", default=None)
"""The id of the request being handled (set by the request-id middleware; logs read it)."""

REQUEST_ID_SCOPE_KEY = "lad.request_id"
"""Where the request-id middleware leaves the id in the ASGI scope."""


def log_unexpected(exc: BaseException, what: str) -> None:
    """One compact line per unexpected error: type, where it was raised, the request id.

    The full traceback goes to DEBUG only, so a flood of bad requests cannot flood the log.
    """
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else "?"
    text = str(exc).replace("\n", " ")[:300]
    log.error(
        "%s: %s at %s (request_id=%s): %s", what, type(exc).__name__, where, REQUEST_ID.get(), text
    )
    log.debug("traceback of the error above", exc_info=exc)


REQUEST_STAGES: tuple[str, ...] = ("body", "work", "queue", "answer")
"""Every value of the stage label (``body``: the client left during its upload)."""


@dataclass
class RequestStage:
    """The current request's stage (one mutable object, shared by the request's tasks)."""

    value: str = "work"


STAGE: ContextVar[RequestStage | None] = ContextVar("lad_request_stage", default=None)


@contextmanager
def mark_stage(name: str) -> Iterator[None]:
    """Mark the current request as in ``name`` while the block runs (nothing outside one)."""
    holder = STAGE.get()
    if holder is None:
        yield
        return
    previous, holder.value = holder.value, name
    try:
        yield
    finally:
        holder.value = previous
