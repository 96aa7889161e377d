"""Prometheus metrics of one app instance (names prefixed ``lad_``, seconds, base units).

The series and their labels are the ones deploy/README.md "Series" lists (the alert rules
and the dashboard read exactly those). Each app owns its own CollectorRegistry, so several
apps in one process (tests, two replicas) never collide.

Labels: ``http_method`` is the HTTP verb; ``method`` is always a retrieval method (agd,
vanilla, ...), empty where none applies. Stage names are the keys of ``timings_ms`` as the
service's stage runner reports them (``app.service.pipeline.TIMINGS``, from its one tuple
of stages). ``lad_debias_overhead_ratio`` is (score + debias) / forward per request,
forward and score being the request's share of its batch; the attention-row capture runs
inside the forward and is measured apart, on a sample of batches, by the shadow forward
(``lad_debias_latency_overhead_ratio``, app.service.shadow).

Label values that panels and alerts select (error codes, calibration outcomes, fallback
methods and N, store operations) are created at 0, so a quiet service shows 0, not
"No data". The ``_created`` series are off (they double every counter's series).

Beside the ``lad_`` series every registry carries (app.observability.collectors) prometheus_client's
standard collectors (``process_*``: resident memory, CPU seconds, open and max file
descriptors, start time; ``python_gc_*``, ``python_info``), as the default registry would, and
``lad_build_info`` (version, model, revision, dtype, device), set when the model is loaded.
``lad_gpu_memory_bytes`` has no samples on a replica without CUDA: the dashboard panel says
so and the GPU alert needs the series (deploy/README.md "Series").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import prometheus_client
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
)

from app import errors
from app.method.methods import NEEDS_CALIBRATION
from app.observability.collectors import (
    EncoderCacheCollector,
    GpuMemoryCollector,
    ProfileCollector,
    ProfileRow,
    package_version,
    register_runtime,
)
from app.observability.request_context import REQUEST_STAGES
from lad_client.vocabulary import IGNORED_RERANK_FIELDS

prometheus_client.disable_created_metrics()

STORE_WRITE_DROP_REASONS = ("queue_full", "store_error", "paused")
"""Why an evidence write was dropped (``app.service.evidence_writes``)."""
STORE_OPERATIONS: tuple[str, ...] = (
    "get",
    "put",
    "list",
    "versions",
    "delete",
    "rollback",
    "health",
    "write_probe",
)
CALIBRATION_OUTCOMES: tuple[str, ...] = ("success", "invalid", "error")
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_RATIO_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2)
# the shadow comparison of two timed forwards can come out slightly negative (noise)
_SIGNED_RATIO_BUCKETS = (
    -0.05,
    -0.02,
    -0.01,
    -0.005,
    0,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1,
    2,
)
_BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
_IMAGE_BUCKETS = (2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 64)
_TOKEN_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)

CLIENT_CLOSED_STATUS = 499
CLIENT_CLOSED_CODE = "client_closed_request"
"""A client that left before its request was read (nginx's 499): not a server error."""


MEDIA_OUTCOMES = ("ok", "not_allowed", "failed", "timeout", "too_large")
"""Values of ``lad_media_fetches_total{outcome}`` (app/service/decode/media.py)."""


def error_codes() -> list[str]:
    """Every code of the error table (app.errors), the generic ones included."""
    found: set[str] = {"http_error", CLIENT_CLOSED_CODE}
    stack: list[type[errors.ServiceError]] = [errors.ServiceError]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if cls is not errors.ServiceError:
            found.add(cls.code)
    return sorted(found)


class Metrics:
    """All metrics of one service instance, registered in ``self.registry``."""

    def __init__(self, max_images: int = 12, max_queue: int | None = None) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        register_runtime(r)
        self._http(r)
        self._pipeline(r)
        self._answers(r, max_images)
        self._state(r, max_queue)
        self._profiles = ProfileCollector(lambda: iter(()))
        r.register(self._profiles)
        r.register(GpuMemoryCollector())
        self._encoder_cache = EncoderCacheCollector()
        r.register(self._encoder_cache)

    # ------------------------------------------------------------------ declarations
    def _http(self, r: CollectorRegistry) -> None:
        self.requests = Counter(
            "lad_requests",
            "HTTP requests by route template, HTTP verb and status",
            ["route", "http_method", "status"],
            registry=r,
        )
        self.request_duration = Histogram(
            "lad_request_duration_seconds",
            "HTTP request latency; method = retrieval method on /v1/retrieve, else empty",
            ["route", "http_method", "method"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "lad_requests_in_flight",
            "HTTP requests being handled (not /metrics, /healthz, /readyz)",
            registry=r,
        )
        self.errors = Counter("lad_errors", "Error answers by code", ["code"], registry=r)
        for code in error_codes():
            self.errors.labels(code=code)

    def _pipeline(self, r: CollectorRegistry) -> None:
        self.stage_duration = Histogram(
            "lad_stage_duration_seconds",
            "Latency of each pipeline stage per request",
            ["stage", "method"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.debias_overhead = Histogram(
            "lad_debias_overhead_ratio",
            "(score + debias) time over forward time per request (capture is inside forward)",
            ["method"],
            buckets=_RATIO_BUCKETS,
            registry=r,
        )
        self.debias_latency_overhead = Histogram(
            "lad_debias_latency_overhead_ratio",
            "Shadow-sampled batches: (forward with capture - plain SDPA forward) over "
            "(plain forward + score), the extra latency of the attention evidence",
            buckets=_SIGNED_RATIO_BUCKETS,
            registry=r,
        )
        self.shadow_forward = Histogram(
            "lad_shadow_forward_seconds",
            "Plain forwards run for the overhead sample (model time not spent on requests)",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "lad_batch_size", "Items per forward batch", buckets=_BATCH_BUCKETS, registry=r
        )
        self.request_images = Histogram(
            "lad_request_images",
            "Candidate images (N) per retrieve request",
            ["method"],
            buckets=_IMAGE_BUCKETS,
            registry=r,
        )
        self.rerank_ignored_fields = Counter(
            "lad_rerank_ignored_fields",
            "Fields of rerank requests accepted and ignored (other APIs' options that change "
            "nothing for an image ranking), by field: a well-known name "
            "(lad_client.vocabulary.IGNORED_RERANK_FIELDS) or other",
            ["field"],
            registry=r,
        )
        for name in (*IGNORED_RERANK_FIELDS, "other"):
            self.rerank_ignored_fields.labels(field=name)
        self.media_fetches = Counter(
            "lad_media_fetches",
            "Image URL fetches (LAD_MEDIA_ALLOWED_DOMAINS) by outcome: ok, not_allowed (the "
            "policy refused a URL, a redirect or an address), failed, timeout, too_large",
            ["outcome"],
            registry=r,
        )
        for outcome in MEDIA_OUTCOMES:
            self.media_fetches.labels(outcome=outcome)
        self.media_fetched_bytes = Counter(
            "lad_media_fetched_bytes", "Bytes of the images fetched by URL", registry=r
        )
        self.prompt_tokens = Histogram(
            "lad_prompt_tokens",
            "Tokens of one forward prompt per retrieve request, images included",
            ["method"],
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )

    def _answers(self, r: CollectorRegistry, max_images: int) -> None:
        self.predicted_position = Counter(
            "lad_predicted_position",
            "Answers by predicted 0-based position; kind raw (model "
            "argmax) or debiased; profile/labels of the profile served, empty without one",
            ["method", "kind", "position", "profile", "labels", "n"],
            registry=r,
        )
        self.fallback = Counter(
            "lad_fallback",
            "Vanilla fallback answers for want of a profile (not debiased), "
            "by requested method and N",
            ["method", "n"],
            registry=r,
        )
        for method in sorted(NEEDS_CALIBRATION):
            for n in range(2, max_images + 1):
                self.fallback.labels(method=method, n=str(n))
        self.calibrations = Counter(
            "lad_calibrations", "Calibrations by outcome", ["outcome"], registry=r
        )
        for outcome in CALIBRATION_OUTCOMES:
            self.calibrations.labels(outcome=outcome)
        self.calibration_duration = Histogram(
            "lad_calibration_duration_seconds",
            "Duration of successful calibrations",
            buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
            registry=r,
        )
        self.model_info = Info("lad_model", "The model this replica serves", registry=r)
        self.build_info = Info(
            "lad_build",
            "The lad-serve version and the model it runs (set once loaded)",
            registry=r,
        )

    def _state(self, r: CollectorRegistry, max_queue: int | None) -> None:
        self.queue_depth = Gauge(
            "lad_queue_depth", "Items waiting for the model worker", registry=r
        )
        self.queue_capacity = Gauge(
            "lad_queue_capacity", "Queue capacity (LAD_MAX_QUEUE)", registry=r
        )
        if max_queue is not None:
            self.queue_capacity.set(max_queue)
        self.inflight_bytes = Gauge(
            "lad_inflight_bytes",
            "Bytes the requests in flight hold by the in-flight budget (bodies, decoded pixels, "
            "answers being written); never above lad_inflight_bytes_capacity",
            registry=r,
        )
        self.inflight_bytes_capacity = Gauge(
            "lad_inflight_bytes_capacity",
            "The replica's in-flight byte budget (LAD_MAX_INFLIGHT_BYTES)",
            registry=r,
        )
        self.requests_abandoned = Counter(
            "lad_requests_abandoned",
            "Requests whose client went away before its answer, by the stage they were in "
            "(their queued forward passes are dropped)",
            ["stage"],
            registry=r,
        )
        for stage in REQUEST_STAGES:
            self.requests_abandoned.labels(stage=stage)
        self.requests_deadline_exceeded = Counter(
            "lad_requests_deadline_exceeded",
            "Requests answered 504 `deadline_exceeded`: their X-Request-Timeout passed first",
            registry=r,
        )
        self.store_errors = Counter(
            "lad_store_errors", "Calibration store errors", ["operation"], registry=r
        )
        for operation in STORE_OPERATIONS:
            self.store_errors.labels(operation=operation)
        self.store_writes_dropped = Counter(
            "lad_store_writes_dropped",
            "Evidence writes dropped without waiting for the store (queue_full: the store is "
            "slow; store_error: the write failed; paused: a write failed lately)",
            ["reason"],
            registry=r,
        )
        for reason in STORE_WRITE_DROP_REASONS:
            self.store_writes_dropped.labels(reason=reason)
        self.store_degraded = Gauge(
            "lad_store_degraded",
            "1 while the store is unreachable and the replica serves its cached profiles, else 0",
            registry=r,
        )
        self.store_writes_failing = Gauge(
            "lad_store_writes_failing",
            "1 while the store refuses writes (its latest write or "
            "write probe failed: full disk, read-only, Redis at maxmemory), else 0",
            registry=r,
        )
        self.feedback = Counter(
            "lad_feedback",
            "POST /v1/feedback answers by outcome (counted, duplicate)",
            ["outcome"],
            registry=r,
        )
        self.refreshes = Counter(
            "lad_profile_refreshes",
            "Profile refreshes by decision (live, candidate)",
            ["decision"],
            registry=r,
        )
        for outcome in ("counted", "duplicate"):
            self.feedback.labels(outcome=outcome)
        for decision in ("live", "candidate"):
            self.refreshes.labels(decision=decision)

    # ------------------------------------------------------------------ observations
    def observe_stages(self, timings_ms: dict[str, float], method: str) -> None:
        """One observation per stage key the service's stage runner timed."""
        for stage, ms in timings_ms.items():
            self.stage_duration.labels(stage=stage, method=method).observe(ms / 1000.0)

    def observe_answer(
        self,
        *,
        method: str,
        n: int,
        raw: int,
        debiased: int | None,
        profile: tuple[str, str] | None,
        fallback_for: str | None,
        prompt_tokens: int | None,
    ) -> None:
        """One retrieve answer: positions, N, prompt size, and the fallback it may be.

        ``profile`` is (name, label scheme) of the profile served; ``fallback_for`` the
        requested method when the vanilla fallback answered instead.
        """
        name, labels = profile or ("", "")
        common = {"method": method, "profile": name, "labels": labels, "n": str(n)}
        self.predicted_position.labels(kind="raw", position=str(raw), **common).inc()
        if debiased is not None:
            self.predicted_position.labels(kind="debiased", position=str(debiased), **common).inc()
        if fallback_for is not None:
            self.fallback.labels(method=fallback_for, n=str(n)).inc()
        self.request_images.labels(method=method).observe(n)
        if prompt_tokens is not None:
            self.prompt_tokens.labels(method=method).observe(prompt_tokens)

    def expect_errors(self, route: str, http_method: str, statuses: Iterable[int]) -> None:
        """Create a route's error counters at 0 (panels of 5xx / 429 shares show 0)."""
        for status in statuses:
            self.requests.labels(route=route, http_method=http_method, status=str(status))

    def observe_request(
        self,
        route: str,
        http_method: str,
        status: int,
        seconds: float,
        method: str,
        error_code: str | None,
    ) -> None:
        self.requests.labels(route=route, http_method=http_method, status=str(status)).inc()
        self.request_duration.labels(route=route, http_method=http_method, method=method).observe(
            seconds
        )
        if error_code is not None:
            self.errors.labels(code=error_code).inc()

    # ------------------------------------------------------------------ read at scrape time
    def watch_queue(self, depth: Callable[[], int], capacity: int) -> None:
        self.queue_depth.set_function(lambda: float(depth()))
        self.queue_capacity.set(capacity)

    def watch_inflight_bytes(self, used: Callable[[], int], capacity: int) -> None:
        self.inflight_bytes.set_function(lambda: float(used()))
        self.inflight_bytes_capacity.set(capacity)

    def watch_store(self, health: Callable[[], dict[str, Any]]) -> None:
        """``lad_store_degraded`` and ``lad_store_writes_failing`` from the store's own health
        (cheap, no I/O: the write state is the one its last write or probe recorded)."""

        def flag(bad: Callable[[dict[str, Any]], bool]) -> Callable[[], float]:
            def read() -> float:
                try:
                    return 1.0 if bad(health()) else 0.0
                except Exception:
                    return 1.0

            return read

        self.store_degraded.set_function(flag(lambda h: not h.get("ok", False)))
        self.store_writes_failing.set_function(flag(lambda h: h.get("writes") == "failing"))

    def watch_encoder_cache(self, snapshot: Callable[[], dict[str, int]]) -> None:
        """The ``lad_encoder_cache_*`` series from the runner's cache (read at scrape time)."""
        self._encoder_cache.source = snapshot

    def watch_profiles(self, source: Callable[[], Iterable[ProfileRow]]) -> None:
        self._profiles.source = source

    def set_model_info(self, info: dict[str, Any]) -> None:
        """``lad_model_info`` from the loaded model's facts, and ``lad_build_info`` (the
        package version with the model id, revision, dtype and device)."""
        text = {k: "" if v is None else str(v) for k, v in info.items()}
        self.model_info.info(text)
        self.build_info.info(
            {
                "version": package_version(),
                "model": text.get("model_id", ""),
                "revision": text.get("revision", ""),
                "dtype": text.get("dtype", ""),
                "device": text.get("device", ""),
            }
        )

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
