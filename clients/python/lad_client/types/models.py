"""GET /v1/models: the served model, in OpenAI's list shape (so OpenAI-style clients and
rerank integrations can discover the id to send as ``model``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ModelCard(BaseModel):
    """One served model."""

    id: str = Field(
        description="the served model name (LAD_SERVED_MODEL_NAME), as `model` in requests "
        "and responses"
    )
    object: Literal["model"] = Field("model", description='always "model"')
    created: int = Field(description="when this process loaded it (Unix seconds)")
    owned_by: str = Field("lad", description='always "lad"')


class ModelList(BaseModel):
    """Every model this process serves (exactly one)."""

    object: Literal["list"] = Field("list", description='always "list"')
    data: list[ModelCard] = Field(description="the served model (one entry)")
