"""GET /healthz and /readyz: liveness and readiness."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class Health(BaseModel):
    """Liveness: the process answers."""

    status: Literal["ok"] = Field("ok", description="always ok")


class Readiness(BaseModel):
    """200 whenever the model can answer retrieve; ``status`` is ``degraded`` while the store
    is unreachable or refuses writes (retrieval serves the cached profiles, admin routes
    answer 503)."""

    ready: bool = Field(description="the model is loaded and its worker runs")
    status: Literal["ok", "degraded", "not_ready"] = Field(
        "ok",
        description="ok; degraded while the store is unreachable or refuses writes "
        "(store.writes: failing); not_ready",
    )
    model: dict[str, object] = Field(
        description="loaded, worker_running, model_id, revision, dtype, device, "
        "attention_backend, layers"
    )
    store: dict[str, object] = Field(
        description="the profile store's health (backend, status, "
        "writes: ok, failing or unknown, ...)"
    )
    queue: dict[str, int] = Field(description="depth, max_queue, max_batch_size")
