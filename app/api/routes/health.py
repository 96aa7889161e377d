"""Liveness, readiness and the Prometheus scrape endpoint."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from app.api.registry import register
from app.api.route_table import HEALTHZ, METRICS, READYZ
from lad_client.types import Health, Readiness

router = APIRouter(tags=["health"])


@register(router, HEALTHZ)
async def healthz() -> Health:
    return Health()


@register(
    router,
    READYZ,
    responses={
        503: {
            "model": Readiness,
            "description": "`not_ready`: the model is not loaded (yet); the body "
            "is the readiness report, not the error envelope",
        }
    },
)
async def readyz(request: Request) -> JSONResponse:
    service = getattr(request.app.state, "service", None)
    if service is None:
        body = Readiness(
            ready=False, status="not_ready", model={"loaded": False}, store={}, queue={}
        )
    else:
        body = await service.readiness()
    return JSONResponse(body.model_dump(mode="json"), status_code=200 if body.ready else 503)


@register(router, METRICS)
async def metrics(request: Request) -> Response:
    content, media_type = request.app.state.metrics.render()
    return Response(content, media_type=media_type)
