"""Online calibration routes: POST /v1/feedback and POST /v1/profiles/{name}/refresh."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from app import errors
from app.api.bodies import content_type, is_json, read_json
from app.api.deps import AdminAuth, RetrieveAuth, ServiceDep
from app.api.route_errors import error_responses
from app.api.routes.profiles import LabelsParam, NameParam, NParam
from lad_client.types import FeedbackRequest, FeedbackResponse, RefreshResponse

router = APIRouter(tags=["online calibration"])

ForceParam = Annotated[
    bool,
    Query(
        description="go live without the held-out accuracy guard (operator's call)",
        examples=[False],
    ),
]


@router.post(
    "/v1/feedback",
    response_model=FeedbackResponse,
    dependencies=[RetrieveAuth],
    responses=error_responses("POST", "/v1/feedback"),
    summary="Tell the service which candidate of an earlier retrieval was right",
)
async def feedback(request: Request, service: ServiceDep) -> FeedbackResponse:
    """Adds the retrieval's evidence (kept LAD_EVIDENCE_TTL_S) to its profile's feedback
    statistics, once per request id; a repeat answers `counted: false`."""
    media_type = content_type(request)
    if not is_json(media_type):
        raise errors.UnsupportedMediaType(
            f"content type {media_type or '(none)'!r} is not supported; send application/json"
        )
    body: FeedbackRequest = await read_json(request, FeedbackRequest)
    return await service.online.feedback(body.request_id, body.answer)


@router.post(
    "/v1/profiles/{name}/refresh",
    response_model=RefreshResponse,
    dependencies=[AdminAuth],
    responses=error_responses("POST", "/v1/profiles/{name}/refresh"),
    summary="Blend feedback into a profile; live only if not less accurate",
)
async def refresh_profile(
    name: NameParam,
    n: NParam,
    service: ServiceDep,
    labels: LabelsParam = "digits",
    force: ForceParam = False,
) -> RefreshResponse:
    return await service.online.refresh(name, labels, n, force)
