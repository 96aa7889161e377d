"""app.observability.metrics on its own: pre-created label values, GPU memory only with
CUDA, the process collectors and the build info."""

from __future__ import annotations

import sys
import types

from prometheus_client import generate_latest

from app import errors
from app.observability.metrics import GpuMemoryCollector, Metrics, error_codes, package_version
from tests.api.helpers import metric_value


def test_every_error_code_of_the_table_is_pre_created_at_zero() -> None:
    codes = error_codes()
    # the codes the alert rules and the docs name, and one of every other kind
    named = {
        "calibration_required",
        "profile_mismatch",
        "overloaded",
        "engine_error",
        "internal_error",
        "store_unavailable",
        "not_ready",
        "invalid_image",
        "not_found",
    }
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
        is_available=lambda: available,
        is_initialized=lambda: available,
        device_count=lambda: 2,
        memory_allocated=lambda i: 100 + i,
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


def test_process_metrics_are_in_every_registry() -> None:
    """The standard process collectors (Linux /proc): memory, CPU, file descriptors."""
    first, second = Metrics().render()[0].decode(), Metrics().render()[0].decode()
    for text in (first, second):  # two registries in one process do not collide
        assert metric_value(text, "process_resident_memory_bytes") > 1e6
        assert metric_value(text, "process_cpu_seconds_total") > 0
        assert metric_value(text, "process_open_fds") >= 3
        assert metric_value(text, "process_max_fds") >= metric_value(text, "process_open_fds")
        assert metric_value(text, "process_start_time_seconds") > 1.5e9
        assert "python_info{" in text


def test_build_info_names_the_version_and_the_loaded_model() -> None:
    metrics = Metrics()
    assert "lad_build_info{" not in metrics.render()[0].decode()  # not before the model loads
    metrics.set_model_info(
        {
            "model_id": "Qwen/Qwen2.5-VL-3B-Instruct",
            "revision": None,
            "dtype": "bfloat16",
            "device": "cuda:0",
            "attention_backend": "sdpa",
            "layers": "21,22",
        }
    )
    text = metrics.render()[0].decode()
    labels = {
        "version": package_version(),
        "model": "Qwen/Qwen2.5-VL-3B-Instruct",
        "revision": "",
        "dtype": "bfloat16",
        "device": "cuda:0",
    }
    assert metric_value(text, "lad_build_info", **labels) == 1
    assert package_version().count(".") >= 2
    (line,) = [x for x in text.splitlines() if x.startswith("lad_build_info{")]
    assert "attention_backend" not in line and "layers" not in line  # those are lad_model_info
