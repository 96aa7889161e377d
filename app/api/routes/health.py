"""Liveness, readiness and the Prometheus scrape endpoint."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from app.api.route_errors import error_responses
from lad_client.types import Health, Readiness

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, responses=error_responses("GET", "/healthz"),
            summary="The process is alive")
async def healthz() -> Health:
    return Health()


@router.get(
    "/readyz", response_model=Readiness,
    responses={**error_responses("GET", "/readyz"),
               503: {"model": Readiness, "description": "the model is not loaded (yet)"}},
    summary="Can answer retrieve: 200 while the model is loaded, store ok or degraded",
)  # fmt: skip
async def readyz(request: Request) -> JSONResponse:
    service = getattr(request.app.state, "service", None)
    if service is None:
        body = Readiness(ready=False, status="not_ready", model={"loaded": False}, store={},
                         queue={})  # fmt: skip
    else:
        body = await service.readiness()
    return JSONResponse(body.model_dump(mode="json"), status_code=200 if body.ready else 503)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response,
            responses=error_responses("GET", "/metrics"))
async def metrics(request: Request) -> Response:
    content, media_type = request.app.state.metrics.render()
    return Response(content, media_type=media_type)
