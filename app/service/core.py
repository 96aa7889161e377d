"""The service: one model, one queue, one store, and the handler of every feature.

`Service` builds the request pipeline (``app.service.pipeline``: the model worker with its
one queue and thread, the decoder, the profiles, the method configuration), the online
calibration loop and one handler per feature (``app.service.handlers``), and reports
readiness. Routes parse and authorize, then call their handler, which they get through a
dependency (``app.api.deps``).
"""

from __future__ import annotations

import time
from typing import Any

from starlette.concurrency import run_in_threadpool

from app.engine.interface import RunnerLike
from app.observability.metrics import Metrics
from app.service.handlers import Handlers
from app.service.online import OnlineService
from app.service.pipeline import Pipeline
from app.service.profile_service import ProfileService
from app.settings import Settings
from calibration_store import OnlineStore, ProfileStore
from calibration_store.evidence import MemoryOnlineStore
from lad_client.types import ModelCard, ModelList, Readiness

_PUBLIC_STORE_HEALTH = (
    "backend",
    "profiles",
    "connected",
    "listening",
    "last_sync_age_s",
    "writes",
)
"""What /readyz shows of the store's health (never paths or error strings: those are logged)."""


class Service:
    """One model, one queue, one store: everything the routes need."""

    def __init__(
        self,
        settings: Settings,
        runner: RunnerLike,
        store: ProfileStore,
        metrics: Metrics,
        online: OnlineStore | None = None,
    ) -> None:
        self.settings = settings
        self.runner = runner
        self.created = int(time.time())  # the model is loaded: GET /v1/models' `created`
        self.store = store
        self.metrics = metrics
        self.profiles = ProfileService(runner, store, metrics)
        self.pipeline = Pipeline(settings, runner, self.profiles, metrics)
        self.worker = self.pipeline.worker
        self.budget = self.pipeline.decoder.budget  # the body guard reserves bodies in it
        metrics.watch_inflight_bytes(lambda: self.budget.used, self.budget.capacity)
        self.online = OnlineService(
            settings,
            self.profiles,
            online
            or MemoryOnlineStore(
                ttl_s=settings.evidence_ttl_s, max_entries=settings.evidence_max_entries
            ),
        )
        self.handlers = Handlers.build(self.pipeline, self.online)
        metrics.set_model_info(self.model_info())
        metrics.watch_store(store.health)
        cache = getattr(runner, "encoder_cache", None)  # stand-in runners have none
        if cache is not None:
            metrics.watch_encoder_cache(cache.snapshot)

    @property
    def model_id(self) -> str:
        return str(self.runner.model_id)

    def model_info(self) -> dict[str, Any]:
        r = self.runner
        return {
            "model_id": r.model_id,
            "revision": r.revision,
            "dtype": str(r.dtype).removeprefix("torch."),
            "device": str(r.device),
            "attention_backend": r.attention_backend,
            "layers": ",".join(str(x) for x in r.layers),
        }

    def start(self) -> None:
        self.worker.start()

    async def readiness(self) -> Readiness:
        """Ready = can answer retrieve: the model is loaded and its worker runs. The store
        is reported beside it (``degraded`` when unreachable: retrieval serves the profiles
        already cached, admin routes answer 503), without paths or error strings. A store
        that refuses writes (``writes: failing``, from its last write or a probe) is degraded
        too, and readiness stays 200: retrieval does not write profiles, and taking every
        replica out of the load balancer for it would turn a store fault into an outage."""
        try:
            if await run_in_threadpool(self.store.check_writes) is False:
                self.metrics.store_errors.labels(operation="write_probe").inc()
            health = await run_in_threadpool(self.store.health)
        except Exception:  # a store that cannot even report is degraded, not fatal
            self.metrics.store_errors.labels(operation="health").inc()
            health = {"ok": False}
        batcher = self.worker.batcher
        store = {k: health[k] for k in _PUBLIC_STORE_HEALTH if k in health}
        healthy = health.get("ok", False) and health.get("writes") != "failing"
        store["status"] = "ok" if healthy else "degraded"
        if health.get("errors"):
            store["unreadable_profiles"] = len(health["errors"])
        return Readiness(
            ready=batcher.running,
            status="ok" if batcher.running and store["status"] == "ok" else "degraded",
            model={"loaded": True, "worker_running": batcher.running, **self.model_info()},
            store=store,
            queue={
                "depth": batcher.depth,
                "max_queue": batcher.max_queue,
                "max_batch_size": batcher.max_batch_size,
            },
        )

    def stop(self) -> None:
        self.worker.stop()

    def models(self) -> ModelList:
        """The one served model (OpenAI's list shape)."""
        return ModelList(data=[ModelCard(id=self.model_id, created=self.created)])
