"""The one error envelope of every error answer."""

from __future__ import annotations

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
    request_id: str | None = Field(
        description="the X-Request-ID of the request (sent, or generated); the server log "
        "has the details under it"
    )


class ErrorResponse(BaseModel):
    """The one error envelope of every error answer."""

    error: ErrorDetail = Field(description="the error")
