"""POST /v1/calibrate: estimate a new profile version from M examples with known answers."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body

from app.api.deps import AdminAuth, ServiceDep
from app.api.route_errors import error_responses
from app.schemas import (
    CALIBRATE_EXAMPLE,
    MAX_CALIBRATION_EXAMPLES,
    RECOMMENDED_CALIBRATION_EXAMPLES,
    CalibrateRequest,
    CalibrateResponse,
)

router = APIRouter(tags=["calibration"])

DESCRIPTION = f"""Run every example under its N cyclic rotations (M·N forward passes through the
same queue as retrieval, in batches), estimate the bias matrix B and the attention prior P, and
store them as a new version of the profile for (model, profile, labels, N).

Send 1..{MAX_CALIBRATION_EXAMPLES} examples ({RECOMMENDED_CALIBRATION_EXAMPLES} recommended), all
with the same number of images N; `answer` is the 0-based index of the matching image. Requires
the admin token when LAD_ADMIN_TOKEN is set."""


@router.post(
    "/v1/calibrate",
    response_model=CalibrateResponse,
    dependencies=[AdminAuth],
    responses=error_responses("POST", "/v1/calibrate"),
    summary="Calibrate a profile (bias matrix B and attention prior P) for one N",
    description=DESCRIPTION,
)
async def calibrate(
    body: Annotated[CalibrateRequest, Body(openapi_examples={"three images": {
        "summary": "one example of three 32 x 32 PNGs", "value": CALIBRATE_EXAMPLE}})],
    service: ServiceDep,
) -> CalibrateResponse:
    return await service.calibrate(body)
