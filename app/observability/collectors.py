"""What a scrape reads beside the declared series of ``metrics``: per-profile gauges and
GPU memory collected at scrape time, the standard process collectors, and the package version
that ``lad_build_info`` carries."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from importlib import metadata
from typing import ClassVar

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

ProfileRow = tuple[str, str, int, int, float, "list[float] | None"]
"""(profile, labels, n, version, created timestamp, calibration position share)."""


class ProfileCollector(Collector):
    """Per profile this replica serves, read at scrape time from the store's in-memory copy:
    lad_profile_version, lad_profile_created_timestamp_seconds and
    lad_profile_calibration_position_share (every position 0..N-1, zeros included)."""

    def __init__(self, source: Callable[[], Iterable[ProfileRow]]) -> None:
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
        share = GaugeMetricFamily(
            "lad_profile_calibration_position_share",
            "Share of the current version's M x N calibration passes whose raw argmax was "
            "this position (profiles calibrated before this was recorded have none)",
            labels=[*names, "position"],
        )
        try:
            rows = list(self.source())
        except Exception:  # a failing store must not break the scrape
            rows = []
        for name, labels, n, ver, ts, position_share in rows:
            version.add_metric([name, labels, str(n)], ver)
            created.add_metric([name, labels, str(n)], ts)
            for position, value in enumerate(position_share or ()):
                share.add_metric([name, labels, str(n), str(position)], value)
        yield version
        yield created
        yield share


class GpuMemoryCollector(Collector):
    """lad_gpu_memory_bytes{device, type}: torch's allocated and reserved bytes and the
    device's total, per CUDA device, at scrape time. Nothing without torch or CUDA (torch
    is never imported here: the wire path stays torch-free)."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "lad_gpu_memory_bytes",
            "GPU memory: torch allocated and reserved, device total",
            labels=["device", "type"],
        )
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and cuda.is_available() and cuda.is_initialized():
            for index in range(cuda.device_count()):
                device = f"cuda:{index}"
                family.add_metric([device, "allocated"], float(cuda.memory_allocated(index)))
                family.add_metric([device, "reserved"], float(cuda.memory_reserved(index)))
                total = cuda.get_device_properties(index).total_memory
                family.add_metric([device, "total"], float(total))
        yield family


class EncoderCacheCollector(Collector):
    """The encoder cache's counters and size, read at scrape time from the runner's cache
    (``EncoderCache.snapshot``; app.engine.encoder_cache): lad_encoder_cache_hits_total,
    _misses_total, _evictions_total, _bypassed_total (calls it could not split), and the
    gauges lad_encoder_cache_bytes, _capacity_bytes (LAD_ENCODER_CACHE_MB) and _entries.
    Nothing until a runner with a cache is watched."""

    COUNTERS: ClassVar[dict[str, str]] = {
        "hits": "Image units (images or tiles) whose embeddings came from the encoder cache",
        "misses": "Image units the vision tower encoded (then kept in the encoder cache)",
        "evictions": "Encoder cache entries dropped to stay within LAD_ENCODER_CACHE_MB",
        "bypassed": "get_image_features calls that ran uncached (no split for the call)",
    }
    GAUGES: ClassVar[dict[str, str]] = {
        "bytes": "Bytes of image embeddings the encoder cache holds",
        "capacity_bytes": "The encoder cache's bound (LAD_ENCODER_CACHE_MB)",
        "entries": "Image units the encoder cache holds",
    }

    def __init__(self) -> None:
        self.source: Callable[[], dict[str, int]] | None = None

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        snapshot = self.source() if self.source is not None else None
        if snapshot is None:
            return
        for name, text in self.COUNTERS.items():
            yield CounterMetricFamily(f"lad_encoder_cache_{name}", text, value=snapshot[name])
        for name, text in self.GAUGES.items():
            yield GaugeMetricFamily(f"lad_encoder_cache_{name}", text, value=snapshot[name])


def package_version() -> str:
    """The installed lad-serve's version (the source tree's when it runs uninstalled)."""
    try:
        return metadata.version("lad-serve")
    except metadata.PackageNotFoundError:
        from app import __version__

        return __version__


def register_runtime(r: CollectorRegistry) -> None:
    """The default registry's process, platform and GC collectors, in registry ``r``
    (``process_*`` read /proc: Linux only, nothing elsewhere)."""
    ProcessCollector(registry=r)
    PlatformCollector(registry=r)
    GCCollector(registry=r)
