"""Where a request is, for the requests that are given up: ``work`` (its body read, decoding,
waiting for room in the byte budget), ``queue`` (its forward passes queued or running) or
``answer`` (being written). The lifetime middleware opens one ``RequestStage`` per request;
the code that moves a request on marks it, and an abandoned request is counted by it
(``lad_requests_abandoned_total{stage}``: a bounded label)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

REQUEST_STAGES: tuple[str, ...] = ("body", "work", "queue", "answer")
"""Every value of the stage label (``body``: the client left during its upload)."""


@dataclass
class RequestStage:
    """The current request's stage (one mutable object, shared by the request's tasks)."""

    value: str = "work"


STAGE: ContextVar[RequestStage | None] = ContextVar("lad_request_stage", default=None)


@contextmanager
def stage(name: str) -> Iterator[None]:
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
