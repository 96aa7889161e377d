"""POST /v1/retrieve: JSON (base64 images) or multipart/form-data (image files)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from app import errors
from app.api.bodies import read_query_body
from app.api.deps import ServiceDep, SettingsDep
from app.api.registry import register
from app.engine.labels import parse_labels
from lad_client.types import RetrieveOptions, RetrieveRequest, RetrieveResponse

router = APIRouter(tags=["retrieve"])


def _form_labels(raw: dict[str, Any]) -> dict[str, Any]:
    """A form's ``labels`` text: a scheme name, a JSON list or a comma list of N labels."""
    if "labels" in raw:
        try:
            labels = parse_labels(raw["labels"])
        except ValueError as exc:
            raise errors.InvalidLabels(str(exc)) from None
        raw["labels"] = labels if isinstance(labels, str) else list(labels)
    return raw


@register(router, "retrieve")
async def retrieve(
    request: Request, service: ServiceDep, settings: SettingsDep
) -> RetrieveResponse:
    """Answer which of N images matches `query` (JSON with base64 images, or multipart files)."""
    options: RetrieveOptions
    options, query, images = await read_query_body(
        request,
        settings,
        json_model=RetrieveRequest,
        options_model=RetrieveOptions,
        files_field="images",
        max_files=settings.max_images,
        form_fields=_form_labels,
    )
    return await service.retrieve(options, query, images)
