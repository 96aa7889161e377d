"""The handler between HTTP and the engine: decode -> queue -> forward -> score -> debias -> encode.

`Service` owns the model worker (one queue, one thread), the profiles and the metrics.
Routes hand it validated wire schemas and get wire schemas back; numpy arrays and engine
dataclasses never leave the service package. Calibration runs its M·N rotated instances
through the same queue as retrieval, in waves of one batch, so it shares the model fairly.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image
from starlette.concurrency import run_in_threadpool

from app import errors, logs
from app.decode import Decoder, ImageInput
from app.engine import debias
from app.engine.calibrate import calibration_instances
from app.engine.interface import RetrievalItem, RunnerLike
from app.engine.labels import LabelSpec, label_spec, scheme_name
from app.engine.methods import NEEDS_CALIBRATION, MethodConfig, apply_method, passes
from app.metrics import Metrics
from app.service.calibration import build_profile, calibrate_sizes, calibrated_response
from app.service.feedback import OnlineService
from app.service.profiles import ProfileService, calibration_of
from app.service.worker import ModelWorker, Work, WorkResult
from app.settings import Settings
from calibration_store import OnlineStore, Profile, ProfileStore
from calibration_store.evidence import MemoryOnlineStore
from lad_client.types import (
    CalibrateRequest,
    CalibrateResponse,
    ProfileRef,
    Readiness,
    RetrieveDetails,
    RetrieveResponse,
)

_PUBLIC_STORE_HEALTH = ("backend", "profiles", "connected", "listening", "last_sync_age_s",
                        "writes")  # fmt: skip
"""What /readyz shows of the store's health (never paths or error strings: those are logged)."""


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1e3


class Service:
    """One model, one queue, one store: everything the routes need."""

    def __init__(
        self, settings: Settings, runner: RunnerLike, store: ProfileStore, metrics: Metrics,
        online: OnlineStore | None = None,
    ) -> None:
        self.settings = settings
        self.runner = runner
        self.store = store
        self.metrics = metrics
        self.worker = ModelWorker(runner, settings, metrics)
        self.decoder = Decoder(
            settings, pixel_budget=runner.image_pixel_budget(),
            special_tokens=runner.special_tokens(),
            image_size=getattr(runner, "image_size_for", None),
        )  # fmt: skip
        self.profiles = ProfileService(runner, store, metrics)
        self.method_config = MethodConfig(
            top_k=settings.top_k, tau=settings.tau,
            posterior_variant=settings.posterior_variant, mixture=settings.mixture,
            sink_guard=settings.sink_guard,
        )  # fmt: skip
        self.online = OnlineService(
            settings, self.profiles, online or MemoryOnlineStore(
                ttl_s=settings.evidence_ttl_s, max_entries=settings.evidence_max_entries),
            self.method_config,
        )  # fmt: skip
        metrics.set_model_info(self.model_info())
        metrics.watch_store(store.health)

    @property
    def model_id(self) -> str:
        return str(self.runner.model_id)

    def model_info(self) -> dict[str, Any]:
        r = self.runner
        return {
            "model_id": r.model_id, "revision": r.revision,
            "dtype": str(r.dtype).removeprefix("torch."), "device": str(r.device),
            "attention_backend": r.attention_backend,
            "layers": ",".join(str(x) for x in r.layers),
        }  # fmt: skip

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
            queue={"depth": batcher.depth, "max_queue": batcher.max_queue,
                   "max_batch_size": batcher.max_batch_size},
        )  # fmt: skip

    def stop(self) -> None:
        self.worker.stop()

    # -------------------------------------------------------------------- decode stage
    def check_labels(self, n: int, labels: LabelSpec, where: str) -> list[str]:
        """N within limits and labels the model can score, within the label limits
        (checked before the queue)."""
        strings = self.decoder.candidates(n, labels, where)
        try:
            trie = self.runner.label_trie(strings)  # tokenises the labels; cached by the runner
        except ValueError as exc:
            raise errors.InvalidLabels(f"these labels cannot be scored: {exc}") from None
        self.decoder.check_label_tokens([len(seq) for seq in trie.token_sequences])
        return strings

    def _uncalibrated(self, profile: str, labels: LabelSpec, n: int) -> errors.ServiceError:
        return errors.CalibrationRequired(
            f"no calibration for model {self.model_id!r}, profile {profile!r}, labels "
            f"{scheme_name(labels)!r} and N={n}: POST /v1/calibrate with "
            f'{{"profile": "{profile}", "examples": [...]}} holding 1-64 (5 recommended) '
            f'examples of {n} images each with their answer, or use method "vanilla" or '
            '"perm_avg"'
        )

    def _prepare(
        self, images: Sequence[ImageInput], method: str, profile: str, labels: LabelSpec,
        timings: dict[str, float],
    ) -> tuple[list[Image.Image], Profile | None]:
        """Off the event loop: the profile the method needs (looked up first, so a request
        that will be refused decodes nothing), then the decoded images."""
        stored = None
        if method in NEEDS_CALIBRATION:
            stored = self.profiles.current(profile, labels, len(images))
            if stored is None and not self.settings.fallback_to_vanilla:
                raise self._uncalibrated(profile, labels, len(images))
        return self.decoder.images(images, "images", timings), stored

    # -------------------------------------------------------------------- retrieve
    async def retrieve(
        self,
        *,
        query: str,
        images: Sequence[ImageInput],
        method: str,
        profile: str,
        labels: str | Sequence[str],
        return_details: bool,
    ) -> RetrieveResponse:
        t0 = time.perf_counter()
        spec = label_spec(labels)
        n = len(images)
        logs.note(method=method, requested_method=method, n=n, profile=profile,
                  labels=spec if isinstance(spec, str) else "custom")
        self.decoder.query(query)
        label_strings = self.check_labels(n, spec, "images")
        timings: dict[str, float] = {}
        async with self.decoder.slot():
            pil, stored = await run_in_threadpool(
                self._prepare, images, method, profile, spec, timings
            )
        fallback_for = None
        if method in NEEDS_CALIBRATION and stored is None:
            # the operator's fallback (LAD_FALLBACK_TO_VANILLA): counted as such, not hidden
            fallback_for, method = method, "vanilla"
            logs.note(method=method, fallback=True)
        elif stored is not None:
            logs.note(version=stored.version, labels=stored.label_scheme)
        timings["decode"] = _ms(t0)  # base64 (its own key) and image decode included

        results = await self._forward(query, pil, spec, passes(method, n), timings)
        t1 = time.perf_counter()
        s, a = results[0].scores, results[0].attention
        out = apply_method(
            method, s, a, calibration_of(stored) if stored else None, self.method_config,
            rotated_scores=[r.scores for r in results],
        )  # fmt: skip
        index = int(np.argmax(out.probabilities))
        timings["debias"] = _ms(t1)

        t2 = time.perf_counter()
        debiased = method != "vanilla"
        self.metrics.observe_answer(
            method=method, n=n, raw=int(np.argmax(s)), debiased=index if debiased else None,
            profile=(stored.name, stored.label_scheme) if stored else None,
            fallback_for=fallback_for, prompt_tokens=results[0].prompt_tokens,
        )  # fmt: skip
        details = None
        if return_details:
            details = RetrieveDetails(
                labels=label_strings, scores=s.tolist(),
                debiased_scores=None if out.debiased_scores is None
                else out.debiased_scores.tolist(),
                attention=a.tolist(), layers=list(self.runner.layers),
                batch_size=results[0].batch_size,
            )  # fmt: skip
        response = RetrieveResponse(
            index=index, ranking=debias.ranking(out.probabilities),
            label=label_strings[index], probabilities=out.probabilities.tolist(),
            raw_probabilities=debias.softmax(s).tolist(),
            posterior=None if out.posterior is None else out.posterior.tolist(),
            method=method, debiased=debiased,
            profile=ProfileRef(name=stored.name, version=stored.version) if stored else None,
            model=self.model_id, timings_ms=timings, details=details,
            request_id=errors.REQUEST_ID.get(),
        )  # fmt: skip
        key = stored.key if stored else self.profiles.key(
            profile, self.profiles.fingerprint(spec, n).label_scheme, n)
        await self.online.remember(response.request_id, key, stored.version if stored else None,
                                   s, a)  # fmt: skip
        timings["encode"] = response.timings_ms["encode"] = _ms(t2)
        self._observe(timings, results, method)
        return response

    async def _forward(
        self,
        query: str,
        pil: list[Image.Image],
        spec: LabelSpec,
        rotations: int,
        timings: dict[str, float],
    ) -> list[WorkResult]:
        """The queue, forward and score stages: the first ``rotations`` cyclic orders of the
        images (1 = as given), one instance each; their stage times go into ``timings``."""
        submitted = time.perf_counter()
        orders = debias.rotations(len(pil))[:rotations]
        works = [Work(RetrievalItem(query, [pil[p] for p in o]), spec) for o in orders]
        results = await self.worker.run(works, bulk=False)
        batches = {r.batch_id: r for r in results}.values()
        timings["queue"] = max(0.0, (min(r.started for r in results) - submitted) * 1e3)
        timings["process"] = sum(r.process_ms for r in batches)
        timings["forward"] = sum(r.forward_ms for r in batches)
        timings["score"] = sum(r.score_ms for r in batches)
        return results

    def _observe(self, timings: dict[str, float], results: list[WorkResult], method: str) -> None:
        """Stage latencies, and the overhead ratio on this request's share of its batches."""
        self.metrics.observe_stages(timings, method)
        forward = sum(r.forward_ms / r.batch_size for r in results)
        score = sum(r.score_ms / r.batch_size for r in results)
        if forward > 0:
            self.metrics.debias_overhead.labels(method=method).observe(
                (score + timings["debias"]) / forward
            )

    # -------------------------------------------------------------------- calibrate
    async def calibrate(self, request: CalibrateRequest) -> CalibrateResponse:
        t0 = time.perf_counter()
        try:
            response = await self._calibrate(request, t0)
        except errors.ServiceError as exc:
            client_error = errors.status_of(exc) < 500 and not isinstance(exc, errors.Overloaded)
            self.metrics.calibrations.labels(outcome="invalid" if client_error else "error").inc()
            raise
        except Exception:
            self.metrics.calibrations.labels(outcome="error").inc()
            raise
        self.metrics.calibrations.labels(outcome="success").inc()
        self.metrics.calibration_duration.observe(response.duration_s)
        return response

    def _check_examples(self, request: CalibrateRequest, labels: LabelSpec) -> int:
        """The examples' common N, after the same checks as retrieval; 422 otherwise."""
        sizes = {len(ex.images) for ex in request.examples}
        if len(sizes) != 1:
            raise errors.InvalidCalibration(
                f"all examples must have the same number of images N; got N in {sorted(sizes)}"
            )
        n = sizes.pop()
        self.check_labels(n, labels, "examples[*].images")
        for m, ex in enumerate(request.examples):
            self.decoder.query(ex.query, where=f"examples[{m}].query")
            if ex.answer >= n:
                raise errors.InvalidCalibration(
                    f"examples[{m}].answer is {ex.answer}; it must be a 0-based index < N={n}"
                )
        return n

    async def _calibrate(self, request: CalibrateRequest, t0: float) -> CalibrateResponse:
        if request.n is not None:  # several N from the same examples (design §2.9)
            return await calibrate_sizes(self, request, t0)
        spec = label_spec(request.labels)
        logs.note(profile=request.profile)
        n = self._check_examples(request, spec)
        fingerprint = self.profiles.fingerprint(spec, n)
        logs.note(n=n, labels=fingerprint.label_scheme)
        async with self.decoder.slot():
            decoded = await run_in_threadpool(
                lambda: [
                    self.decoder.images(ex.images, f"examples[{m}].images")
                    for m, ex in enumerate(request.examples)
                ]
            )
        instances, gt = calibration_instances(
            [(ex.query, pil, ex.answer) for ex, pil in zip(request.examples, decoded, strict=True)]
        )
        works = [Work(RetrievalItem(query, images), spec) for query, images in instances]
        results = await self.worker.run(works, bulk=True)
        scores = np.stack([r.scores for r in results])
        attention = np.stack([r.attention for r in results])
        profile = build_profile(
            self, request.profile, fingerprint, scores, attention, gt, len(request.examples)
        )
        stored = await self.profiles.put(profile)
        logs.note(version=stored.version)
        return calibrated_response(self, stored, len(works), t0)
