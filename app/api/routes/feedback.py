"""Online calibration routes: POST /v1/feedback and POST /v1/profiles/{name}/refresh."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from app.api.bodies import read_json
from app.api.deps import FeedbackDep, RefreshDep
from app.api.registry import register
from app.api.route_table import FEEDBACK, REFRESH_PROFILE
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


@register(router, FEEDBACK)
async def feedback(request: Request, handler: FeedbackDep) -> FeedbackResponse:
    """Adds the retrieval's evidence (kept LAD_EVIDENCE_TTL_S) to its profile's feedback
    statistics, once per request id; a repeat answers `counted: false`."""
    body: FeedbackRequest = await read_json(request, FEEDBACK)
    return await handler(body)


@register(router, REFRESH_PROFILE)
async def refresh_profile(
    name: NameParam,
    n: NParam,
    handler: RefreshDep,
    labels: LabelsParam = "digits",
    force: ForceParam = False,
) -> RefreshResponse:
    return await handler(name, labels, n, force)
