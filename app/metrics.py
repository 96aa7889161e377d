"""Prometheus metrics of one app instance (names prefixed ``lad_``, seconds, base units).

Each app owns its own CollectorRegistry, so several apps in one process (tests, two
replicas) never collide. Stage names are the pipeline's: decode, queue, forward, score,
debias, encode. ``lad_debias_overhead_ratio`` is (score + debias) / forward per request,
with forward and score the request's share of its batch: the attention-row capture runs
inside the forward pass and cannot be timed apart from it, so label scoring (the other
work AGD adds around the plain forward) stands in for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

STAGES: tuple[str, ...] = ("decode", "queue", "forward", "score", "debias", "encode")
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_RATIO_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2)
_BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)


class ProfileCollector(Collector):
    """lad_profile_version / lad_profile_created_timestamp_seconds, read at scrape time.

    `source()` yields (profile, labels, n, version, created_timestamp) for the running model
    from the store's in-memory copy, so every replica reports what it would serve.
    """

    def __init__(self, source: Callable[[], Iterator[tuple[str, str, int, int, float]]]) -> None:
        self.source = source

    def collect(self) -> Iterator[GaugeMetricFamily]:
        names = ["profile", "labels", "n"]
        version = GaugeMetricFamily(
            "lad_profile_version", "Current calibration profile version", labels=names
        )
        created = GaugeMetricFamily(
            "lad_profile_created_timestamp_seconds",
            "Creation time of the current calibration profile version (Unix seconds)",
            labels=names,
        )
        try:
            rows = list(self.source())
        except Exception:
            rows = []
        for name, labels, n, ver, ts in rows:
            version.add_metric([name, labels, str(n)], ver)
            created.add_metric([name, labels, str(n)], ts)
        yield version
        yield created


class Metrics:
    """All metrics of one service instance, registered in `self.registry`."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "lad_requests", "HTTP requests", ["route", "method", "status"], registry=r
        )
        self.request_duration = Histogram(
            "lad_request_duration_seconds", "HTTP request latency", ["route", "method"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.stage_duration = Histogram(
            "lad_stage_duration_seconds", "Latency of each pipeline stage per request", ["stage"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.debias_overhead = Histogram(
            "lad_debias_overhead_ratio",
            "(score + debias) time over forward time per request (capture is inside forward)",
            buckets=_RATIO_BUCKETS, registry=r,
        )
        self.queue_depth = Gauge("lad_queue_depth", "Items waiting for the model worker",
                                 registry=r)
        self.batch_size = Histogram("lad_batch_size", "Items per forward batch",
                                    buckets=_BATCH_BUCKETS, registry=r)
        self.calibrations = Counter("lad_calibrations", "Calibrations by outcome", ["outcome"],
                                    registry=r)
        self.calibration_duration = Histogram(
            "lad_calibration_duration_seconds", "Duration of successful calibrations",
            buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600), registry=r,
        )
        self.store_errors = Counter("lad_store_errors", "Calibration store errors",
                                    ["operation"], registry=r)
        self.predicted_position = Counter(
            "lad_predicted_position", "Predicted image position (0-based)",
            ["method", "position", "kind"], registry=r,
        )
        self.model_info = Info("lad_model", "The model this replica serves", registry=r)
        for outcome in ("success", "invalid", "error"):
            self.calibrations.labels(outcome=outcome)
        self._profiles = ProfileCollector(lambda: iter(()))
        r.register(self._profiles)

    def observe_stages(self, timings_ms: dict[str, float]) -> None:
        for stage in STAGES:
            if stage in timings_ms:
                self.stage_duration.labels(stage=stage).observe(timings_ms[stage] / 1000.0)

    def watch_queue(self, depth: Callable[[], int]) -> None:
        self.queue_depth.set_function(lambda: float(depth()))

    def watch_profiles(
        self, source: Callable[[], Iterator[tuple[str, str, int, int, float]]]
    ) -> None:
        self._profiles.source = source

    def set_model_info(self, info: dict[str, Any]) -> None:
        self.model_info.info({k: "" if v is None else str(v) for k, v in info.items()})

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class RequestMetricsMiddleware:
    """Counts requests and their latency by route template (not raw path), method and status."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = scope.get("method", "")
            self.metrics.requests.labels(route=template, method=method, status=str(status)).inc()
            self.metrics.request_duration.labels(route=template, method=method).observe(
                time.perf_counter() - started
            )
