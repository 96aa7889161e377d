"""The one error envelope of every error answer."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class ErrorDetail(BaseModel):
    """What went wrong, for a program (code) and for a person (message)."""

    # A plain string, so that a client parses the codes a newer server adds; the served
    # OpenAPI document lists this server's codes as an enum (app.api.openapi).
    code: str = Field(
        description="the stable cause (docs/api.md: Limits and errors); a newer server may add "
        "codes, so treat an unknown one as its HTTP status"
    )
    message: str = Field(description="for a person: what happened and what to do; never parsed")
    type: str = Field(
        "invalid_request_error",
        description="OpenAI's error class of the HTTP status (invalid_request_error, "
        "authentication_error, permission_error, rate_limit_error, server_error), which "
        "OpenAI-style (vLLM) clients read beside `message`",
    )
    request_id: str | None = Field(
        description="the X-Request-ID of the request (sent, or generated); the server log "
        "has the details under it"
    )


class ErrorResponse(BaseModel):
    """The one error envelope of every error answer: ``error`` is ours; ``message`` and
    ``detail`` repeat its message where other APIs' clients read it (Cohere's SDK reads
    ``message``; Jina's clients and FastAPI services' ``detail``)."""

    error: ErrorDetail = Field(description="the error")
    message: str = Field("", description="error.message again (where Cohere's clients read it)")
    detail: str | list[dict[str, Any]] = Field(
        "",
        description="error.message again, as a FastAPI service answers: a string, or on 422 "
        'a list of one {"loc", "msg", "type"} item (where Jina\'s and Infinity\'s clients '
        "read it)",
    )
