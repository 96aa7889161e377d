"""app.metrics on its own: pre-created label values, GPU memory only with CUDA."""

from __future__ import annotations

import sys
import types

from prometheus_client import generate_latest

from app import errors
from app.metrics import GpuMemoryCollector, Metrics, error_codes
from tests.api.helpers import metric_value


def test_every_error_code_of_the_table_is_pre_created_at_zero() -> None:
    codes = error_codes()
    # the codes the alert rules and the docs name, and one of every other kind
    named = {"calibration_required", "profile_mismatch", "overloaded", "engine_error",
             "internal_error", "store_unavailable", "not_ready", "invalid_image", "not_found"}
    assert named <= set(codes)
    assert all(errors.ServiceError.code != c for c in codes)
    text = Metrics().render()[0].decode()
    for code in codes:
        assert metric_value(text, "lad_errors_total", code=code) == 0, code


def test_fallback_series_exist_for_every_calibrated_method_and_n() -> None:
    text = Metrics(max_images=5).render()[0].decode()
    for method in ("agd", "pride", "attn_pure"):
        for n in range(2, 6):
            assert metric_value(text, "lad_fallback_total", method=method, n=str(n)) == 0
    assert metric_value(text, "lad_fallback_total", method="agd", n="6") is None
    assert metric_value(text, "lad_fallback_total", method="vanilla", n="2") is None


def _fake_torch(available: bool) -> types.ModuleType:
    cuda = types.SimpleNamespace(
        is_available=lambda: available, is_initialized=lambda: available,
        device_count=lambda: 2, memory_allocated=lambda i: 100 + i,
        memory_reserved=lambda i: 200 + i,
        get_device_properties=lambda i: types.SimpleNamespace(total_memory=1000),
    )
    module = types.ModuleType("torch")
    module.cuda = cuda
    return module


def test_gpu_memory_is_exported_per_cuda_device(monkeypatch) -> None:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    registry.register(GpuMemoryCollector())
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(True))
    text = generate_latest(registry).decode()
    assert metric_value(text, "lad_gpu_memory_bytes", device="cuda:1", type="reserved") == 201
    assert metric_value(text, "lad_gpu_memory_bytes", device="cuda:0", type="total") == 1000
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(False))
    assert "lad_gpu_memory_bytes{" not in generate_latest(registry).decode()
