"""POST /v1/retrieve: JSON (base64 images) or multipart/form-data (image files)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from app import errors
from app.api.bodies import (
    FormLimits,
    content_type,
    form_options,
    is_json,
    not_json_or_form,
    query_form_limits,
    read_form,
    read_json,
    split_form,
)
from app.api.deps import RetrieveAuth, ServiceDep, SettingsDep
from app.api.route_errors import error_responses
from app.engine.labels import SCHEMES, parse_labels
from app.engine.methods import METHODS
from app.schemas import RETRIEVE_EXAMPLE, RetrieveOptions, RetrieveRequest, RetrieveResponse
from app.settings import MAX_N, Settings
from calibration_store.profile import NAME_PATTERN

router = APIRouter(tags=["retrieve"])

_OPTION_FIELDS = tuple(RetrieveOptions.model_fields)
_SCHEME_PATTERN = "^(" + "|".join(SCHEMES) + r")$|^\[.*\]$|^[^,]+(,[^,]+)+$"
_MULTIPART_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["query", "images"],
    "additionalProperties": False,
    "properties": {
        "query": {"type": "string", "minLength": 1, "description": "the caption to match"},
        "images": {"type": "array", "items": {"type": "string", "format": "binary"},
                   "minItems": 2, "maxItems": MAX_N,
                   "description": "N >= 2 candidate image files, in order"},
        "method": {"type": "string", "enum": list(METHODS), "default": "agd",
                   "description": "retrieval method"},
        "profile": {"type": "string", "pattern": NAME_PATTERN, "default": "default",
                    "description": "calibration profile name"},
        "labels": {"type": "string", "default": "digits", "pattern": _SCHEME_PATTERN,
                   "description": "scheme name, or a JSON list / comma list of N labels"},
        "return_details": {"type": "boolean", "default": False,
                           "description": "also return scores, attention, layers"},
    },
}  # fmt: skip
_OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": RetrieveRequest.model_json_schema(), "example": RETRIEVE_EXAMPLE,
            },
            "multipart/form-data": {"schema": _MULTIPART_SCHEMA},
        },
    }
}


def form_limits(settings: Settings) -> FormLimits:
    return query_form_limits(settings, settings.max_images, len(_OPTION_FIELDS))


async def _from_form(
    request: Request, settings: Settings
) -> tuple[RetrieveOptions, str, list[str | bytes]]:
    form = await read_form(request, form_limits(settings))
    raw, query, images = split_form(form, "images", _OPTION_FIELDS)
    if "labels" in raw:
        try:
            labels = parse_labels(raw["labels"])
        except ValueError as exc:
            raise errors.InvalidLabels(str(exc)) from None
        raw["labels"] = labels if isinstance(labels, str) else list(labels)
    options = form_options(RetrieveOptions, raw)
    return options, query, images


@router.post(
    "/v1/retrieve",
    response_model=RetrieveResponse,
    dependencies=[RetrieveAuth],
    openapi_extra=_OPENAPI,
    responses=error_responses("POST", "/v1/retrieve"),
    summary="Pick the image that matches the query, with position debiasing",
)
async def retrieve(
    request: Request, service: ServiceDep, settings: SettingsDep
) -> RetrieveResponse:
    """Answer which of N images matches `query` (JSON with base64 images, or multipart files)."""
    media_type = content_type(request)
    if is_json(media_type):
        body: RetrieveRequest = await read_json(request, RetrieveRequest)
        options: RetrieveOptions = body
        query, images = body.query, list(body.images)
    elif media_type == "multipart/form-data":
        options, query, images = await _from_form(request, settings)
    else:
        raise not_json_or_form(media_type)
    return await service.retrieve(
        query=query, images=images, method=options.method, profile=options.profile,
        labels=options.labels, return_details=options.return_details,
    )
