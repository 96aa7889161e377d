"""POST /v1/calibrate: estimate a new profile version from M examples with known answers."""

from __future__ import annotations

from fastapi import APIRouter, Request

from app.api.bodies import read_json
from app.api.deps import CalibrateDep
from app.api.registry import register
from app.api.route_table import CALIBRATE
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

EXAMPLES = {
    "three images": {"summary": "one example of three 32 x 32 PNGs", "value": CALIBRATE_EXAMPLE}
}


@register(router, CALIBRATE, description=DESCRIPTION, json_examples=EXAMPLES)
async def calibrate(request: Request, handler: CalibrateDep) -> CalibrateResponse:
    body: CalibrateRequest = await read_json(request, CALIBRATE)
    return await handler(body)
