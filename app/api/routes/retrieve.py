"""POST /v1/retrieve: JSON (base64 images) or multipart/form-data (image files)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from app import errors
from app.api.bodies import read_query_body
from app.api.deps import RetrieveAuth, ServiceDep, SettingsDep
from app.api.openapi import json_or_form_body
from app.api.route_errors import error_responses
from app.engine.labels import SCHEMES, parse_labels
from app.engine.methods import METHODS
from app.settings import MAX_N
from calibration_store.profile import NAME_PATTERN
from lad_client.types import RETRIEVE_EXAMPLE, RetrieveOptions, RetrieveRequest, RetrieveResponse

router = APIRouter(tags=["retrieve"])

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
_OPENAPI = json_or_form_body(RetrieveRequest, RETRIEVE_EXAMPLE, _MULTIPART_SCHEMA)


def _form_labels(raw: dict[str, Any]) -> dict[str, Any]:
    """A form's ``labels`` text: a scheme name, a JSON list or a comma list of N labels."""
    if "labels" in raw:
        try:
            labels = parse_labels(raw["labels"])
        except ValueError as exc:
            raise errors.InvalidLabels(str(exc)) from None
        raw["labels"] = labels if isinstance(labels, str) else list(labels)
    return raw


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
    options: RetrieveOptions
    options, query, images = await read_query_body(
        request, settings, json_model=RetrieveRequest, options_model=RetrieveOptions,
        files_field="images", max_files=settings.max_images, form_fields=_form_labels,
    )  # fmt: skip
    return await service.retrieve(
        query=query, images=images, method=options.method, profile=options.profile,
        labels=options.labels, return_details=options.return_details,
    )
