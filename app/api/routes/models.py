"""GET /v1/models: the served model in OpenAI's list shape (the id rerank's `model` takes)."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import ServiceDep
from app.api.registry import register
from app.api.route_table import LIST_MODELS
from lad_client.types import ModelList

router = APIRouter(tags=["models"])


@register(router, LIST_MODELS)
async def list_models(service: ServiceDep) -> ModelList:
    return service.models()
