"""Liveness, readiness and the Prometheus scrape endpoint."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from app.schemas import Health, Readiness

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="The process is alive")
async def healthz() -> Health:
    return Health()


@router.get("/readyz", response_model=Readiness,
            responses={503: {"model": Readiness, "description": "not ready"}},
            summary="Model loaded, worker running, store reachable")
async def readyz(request: Request) -> JSONResponse:
    service = getattr(request.app.state, "service", None)
    if service is None:
        body = Readiness(ready=False, model={"loaded": False}, store={}, queue={})
        return JSONResponse(body.model_dump(mode="json"), status_code=503)
    try:
        store = await run_in_threadpool(service.store.health)
    except Exception as exc:  # a store that cannot even report is not ready
        service.metrics.store_errors.labels(operation="health").inc()
        store = {"ok": False, "error": str(exc)}
    running = service.batcher.running
    ready = running and bool(store.get("ok", False))
    body = Readiness(
        ready=ready,
        model={"loaded": True, "worker_running": running, **service.model_info()},
        store=store,
        queue={"depth": service.batcher.depth, "max_queue": service.batcher.max_queue,
               "max_batch_size": service.batcher.max_batch_size},
    )
    return JSONResponse(body.model_dump(mode="json"), status_code=200 if ready else 503)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    content, media_type = request.app.state.metrics.render()
    return Response(content, media_type=media_type)
