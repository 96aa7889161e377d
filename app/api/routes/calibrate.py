"""POST /v1/calibrate: estimate a new profile version from M examples with known answers."""

from __future__ import annotations

from fastapi import APIRouter, Request

from app import errors
from app.api.bodies import content_type, is_json, read_json
from app.api.deps import AdminAuth, ServiceDep
from app.api.route_errors import error_responses
from lad_client.types import (
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
the admin token when LAD_ADMIN_TOKEN is set; the token is checked before the body is read.

With `n` (a list of N, or `"all"`), every requested N is calibrated from the same examples,
which then need at least max(n) images each: per N, each example is cut to its GT plus N - 1
of its negatives (seeded by `seed`) and run in all N rotations (M x sum(n) forward passes in
one batched run); one version per N is stored, all or none, and `per_n` lists them."""

_OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": CalibrateRequest.model_json_schema(),
                "examples": {"three images": {"summary": "one example of three 32 x 32 PNGs",
                                              "value": CALIBRATE_EXAMPLE}},
            }
        },
    }
}


@router.post(
    "/v1/calibrate",
    response_model=CalibrateResponse,
    dependencies=[AdminAuth],
    openapi_extra=_OPENAPI,
    responses=error_responses("POST", "/v1/calibrate"),
    summary="Calibrate a profile (bias matrix B and attention prior P) for one N",
    description=DESCRIPTION,
)
async def calibrate(request: Request, service: ServiceDep) -> CalibrateResponse:
    media_type = content_type(request)
    if not is_json(media_type):
        raise errors.UnsupportedMediaType(
            f"content type {media_type or '(none)'!r} is not supported; send application/json"
        )
    body: CalibrateRequest = await read_json(request, CalibrateRequest)
    return await service.calibrate(body)
