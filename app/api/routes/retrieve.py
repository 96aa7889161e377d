"""POST /v1/retrieve: JSON (base64 images) or multipart/form-data (image files)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from app.api.bodies import read_query_body
from app.api.deps import RetrieveDep, SettingsDep
from app.api.registry import register
from app.api.route_table import RETRIEVE
from lad_client.types import RetrieveResponse

router = APIRouter(tags=["retrieve"])


@register(router, RETRIEVE)
async def retrieve(
    request: Request, handler: RetrieveDep, settings: SettingsDep
) -> RetrieveResponse:
    """Answer which of N images matches `query` (JSON with base64 images, or multipart files)."""
    options, query, images = await read_query_body(request, settings, RETRIEVE, settings.max_images)
    return await handler(options, query, images)
