"""The app factory: one model, one queue, one store per process (`lad serve`: app.serve).

The model and the store are opened in the lifespan (not at import), so building an app
is cheap; tests inject a tiny runner and a memory:// store. What the app opened it closes.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from app import __version__
from app.api.docs import install_docs
from app.api.error_handlers import install_error_handlers
from app.api.lifetime import RequestLifetimeMiddleware
from app.api.main import api_router
from app.api.middleware import (
    BodyGuardMiddleware,
    InFlightLimitMiddleware,
    RequestIdMiddleware,
)
from app.api.openapi import install_openapi
from app.api.route_errors import ROUTE_ERRORS, error_statuses
from app.engine.interface import RunnerLike
from app.observability import tracing
from app.observability.metrics import Metrics
from app.observability.request_metrics import RequestMetricsMiddleware
from app.service import Service
from app.service.profile_service import legacy_profiles_note
from app.settings import Settings
from calibration_store import OnlineStore, ProfileStore, open_online_store, open_store

log = logging.getLogger(__name__)

API_DESCRIPTION = """Position-debiased multi-image retrieval with a multimodal LLM.

`POST /v1/retrieve` answers which of N images matches a text query, corrected for the
model's position bias with attention-guided debiasing (AGD). A profile for (model,
profile name, labels, N) must first be calibrated with `POST /v1/calibrate` (5 examples
with known answers are enough). Every error is `{"error": {"code", "message", "request_id"}}`;
every response carries `X-Request-ID` (the one sent, or a generated one)."""


def load_runner_from_settings(settings: Settings) -> RunnerLike:
    from app.engine.hardware import torch_threads
    from app.models.loader import load_runner  # torch/transformers only when serving

    return load_runner(
        settings.model,
        revision=settings.revision,
        device=settings.device,
        dtype=settings.dtype,
        layers=settings.layers,
        prompt_variant=settings.prompt_variant,
        threads=torch_threads(settings.torch_threads),
        max_pixels=settings.max_pixels,
        min_pixels=settings.min_pixels,
        device_map=settings.device_map,
        trust_remote_code=settings.trust_remote_code,
        served_model_name=settings.served_model_name,
        encoder_cache_mb=settings.encoder_cache_mb,
    )


def open_store_from_settings(settings: Settings) -> ProfileStore:
    return open_store(
        settings.store_url,
        keep_versions=settings.keep_versions,
        key_prefix=settings.store_key_prefix,
        poll_interval=settings.store_poll_s,
    )


def open_online_store_from_settings(settings: Settings) -> OnlineStore:
    return open_online_store(
        settings.store_url,
        key_prefix=settings.store_key_prefix,
        ttl_s=settings.evidence_ttl_s,
        max_entries=settings.evidence_max_entries,
    )


def create_app(
    settings: Settings | None = None,
    *,
    runner: RunnerLike | None = None,
    store: ProfileStore | None = None,
) -> FastAPI:
    """A service app; `runner` and `store` default to what the settings name."""
    settings = settings or Settings()
    metrics = Metrics(max_images=settings.max_images, max_queue=settings.max_queue)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        the_runner = runner or await run_in_threadpool(load_runner_from_settings, settings)
        the_store = store or await run_in_threadpool(open_store_from_settings, settings)
        online = await run_in_threadpool(open_online_store_from_settings, settings)
        service = Service(settings, the_runner, the_store, metrics, online=online)
        service.start()
        app.state.service = service
        log.info("serving %s with store %s", service.model_id, the_store.health().get("backend"))
        if runner is None and (
            note := legacy_profiles_note(the_store, service.model_id, settings.model)
        ):
            log.warning(note)
        tracing.setup()  # OTLP export when the standard OTEL_* variables ask for it
        try:
            yield
        finally:
            app.state.service = None
            await service.online.writes.close()  # the evidence still queued, briefly
            service.stop()
            await service.pipeline.media.aclose()  # the image-URL connections, if any
            online.close()
            if store is None:
                the_store.close()
            await run_in_threadpool(tracing.shutdown)  # flushes the last spans

    app = FastAPI(
        title="lad-serve",
        version=__version__,
        description=API_DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.service = None
    install_error_handlers(app)
    # outermost last: request id (and the last-resort 500) > metrics > in-flight limit >
    # lifetime (disconnects, deadlines) > body guard > routes
    app.add_middleware(BodyGuardMiddleware, settings=settings)
    app.add_middleware(RequestLifetimeMiddleware, metrics=metrics)
    app.add_middleware(InFlightLimitMiddleware, settings=settings)
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics)
    app.add_middleware(RequestIdMiddleware)
    app.include_router(api_router)
    install_docs(app)
    install_openapi(app, settings)
    for verb, path in ROUTE_ERRORS:
        metrics.expect_errors(path, verb, error_statuses((verb, path)))
    return app
