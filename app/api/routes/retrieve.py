"""POST /v1/retrieve: JSON (base64 images) or multipart/form-data (image files)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from app import errors
from app.api.deps import RetrieveAuth, ServiceDep, SettingsDep
from app.api.route_errors import error_responses
from app.engine.labels import parse_labels
from app.engine.methods import METHODS
from app.schemas import RETRIEVE_EXAMPLE, RetrieveOptions, RetrieveRequest, RetrieveResponse
from app.settings import Settings

router = APIRouter(tags=["retrieve"])

_OPTION_FIELDS = tuple(RetrieveOptions.model_fields)
_MULTIPART_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["query", "images"],
    "properties": {
        "query": {"type": "string", "description": "the caption to match"},
        "images": {"type": "array", "items": {"type": "string", "format": "binary"},
                   "description": "N >= 2 candidate image files, in order"},
        "method": {"type": "string", "enum": list(METHODS), "default": "agd",
                   "description": "retrieval method"},
        "profile": {"type": "string", "default": "default",
                    "description": "calibration profile name"},
        "labels": {"type": "string", "default": "digits",
                   "description": 'scheme name, or a JSON list / comma list of labels'},
        "return_details": {"type": "boolean", "default": False,
                           "description": "also return scores, attention, layers"},
    },
}
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
def _validation_error(exc: ValidationError, prefix: str) -> RequestValidationError:
    items = []
    for err in exc.errors(include_url=False):
        item = dict(err)
        item["loc"] = (prefix, *err.get("loc", ()))
        items.append(item)
    return RequestValidationError(items)


def _body_limit(settings: Settings) -> int:
    """Largest plausible body: every image at its byte limit, base64-inflated, plus slack."""
    return settings.max_images * (settings.max_image_bytes * 4 // 3 + 1024) + 1024 * 1024


async def _from_json(request: Request) -> RetrieveRequest:
    body = await request.body()
    try:
        return RetrieveRequest.model_validate_json(body)
    except ValidationError as exc:
        raise _validation_error(exc, "body") from None


async def _from_form(request: Request, settings: Settings) -> tuple[RetrieveOptions, str, list]:
    async with request.form(
        max_files=settings.max_images + 1, max_fields=16,
        max_part_size=max(4 * settings.max_query_chars, 64 * 1024),
    ) as form:
        unknown = sorted(set(form.keys()) - {"query", "images", *_OPTION_FIELDS})
        if unknown:
            raise errors.InvalidRequest(f"unknown form field(s): {', '.join(unknown)}")
        query = form.get("query")
        if not isinstance(query, str):
            raise errors.InvalidRequest("form field `query` (text) is required")
        images: list[str | bytes] = []
        for i, part in enumerate(form.getlist("images")):
            if isinstance(part, UploadFile):
                if part.size is not None and part.size > settings.max_image_bytes:
                    raise errors.ImageTooLarge(
                        f"images[{i}] has {part.size} bytes; the limit is "
                        f"LAD_MAX_IMAGE_BYTES={settings.max_image_bytes}"
                    )
                images.append(await part.read(settings.max_image_bytes + 1))
            else:
                images.append(part)
        raw: dict[str, Any] = {k: form[k] for k in _OPTION_FIELDS if isinstance(form.get(k), str)}
    if "labels" in raw:
        try:
            labels = parse_labels(raw["labels"])
        except ValueError as exc:
            raise errors.InvalidLabels(str(exc)) from None
        raw["labels"] = labels if isinstance(labels, str) else list(labels)
    try:
        options = RetrieveOptions.model_validate(raw)
    except ValidationError as exc:
        raise _validation_error(exc, "form") from None
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
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > _body_limit(settings):
        raise errors.PayloadTooLarge(
            f"request body of {length} bytes exceeds the limit implied by LAD_MAX_IMAGES and "
            "LAD_MAX_IMAGE_BYTES"
        )
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json" or content_type.endswith("+json"):
        body = await _from_json(request)
        options: RetrieveOptions = body
        query, images = body.query, list(body.images)
    elif content_type == "multipart/form-data":
        options, query, images = await _from_form(request, settings)
    else:
        raise errors.UnsupportedMediaType(
            f"content type {content_type or '(none)'!r} is not supported; send application/json "
            "or multipart/form-data"
        )
    return await service.retrieve(
        query=query, images=images, method=options.method, profile=options.profile,
        labels=options.labels, return_details=options.return_details,
    )
