"""docker-compose.yml, validated by the Compose CLI itself (`docker-compose config`).

The checks read the resolved model Compose prints: one image build shared by both CPU
replicas, the admin token required, the GPU profile, the volumes and the grace period,
and Prometheus sending its alerts to the stack's Alertmanager (config checked by amtool).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.conftest import ROOT, dockerfile_env, load_yaml, run, tool

TOKEN = "test-admin-token-0123456789abcdef"


def compose(tmp_path: Path, *args: str, token: str | None = TOKEN, check: bool = True) -> Any:
    """`docker-compose [args] config --format json` with a controlled environment."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LAD_", "COMPOSE_", "DOCKER_")) and k != "PUBLISH_ADDR"
    }
    if token is not None:
        env["LAD_ADMIN_TOKEN"] = token
    empty = tmp_path / "empty.env"  # never the developer's .env
    empty.write_text("")
    done = run(
        [
            tool("docker-compose"),
            "--env-file",
            str(empty),
            "--project-directory",
            str(ROOT),
            "-f",
            str(ROOT / "docker-compose.yml"),
            *args,
            "config",
            "--format",
            "json",
        ],
        env=env,
        check=check,
    )
    return done if not check else json.loads(done.stdout)


@pytest.fixture(scope="module")
def default(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return compose(tmp_path_factory.mktemp("compose"))["services"]


@pytest.fixture(scope="module")
def gpu(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return compose(tmp_path_factory.mktemp("compose"), "--profile", "gpu")["services"]


def test_admin_token_is_required(tmp_path: Path) -> None:
    for token in (None, ""):
        done = compose(tmp_path, token=token, check=False)
        assert done.returncode != 0
        assert "LAD_ADMIN_TOKEN" in done.stderr and "see deploy/README.md" in done.stderr


def test_default_is_the_cpu_pair_built_once(default: dict[str, Any]) -> None:
    assert set(default) == {"redis", "lad-1", "lad-2", "prometheus", "alertmanager", "grafana"}
    built = {name: s for name, s in default.items() if "build" in s}
    assert list(built) == ["lad-1"]
    assert built["lad-1"]["build"]["args"] == {"TORCH_VARIANT": "cpu"}
    assert built["lad-1"]["image"] == default["lad-2"]["image"] == "lad-serve:local"
    assert built["lad-1"]["pull_policy"] == "build" and default["lad-2"]["pull_policy"] == "never"
    for name in ("lad-1", "lad-2"):
        env = default[name]["environment"]
        assert env["LAD_ADMIN_TOKEN"] == TOKEN
        assert env["LAD_STORE_URL"] == "redis://redis:6379/0"
        assert default[name]["depends_on"]["redis"]["condition"] == "service_healthy"


def test_app_containers_are_locked_down_and_drain_before_the_kill(
    default: dict[str, Any],
) -> None:
    for name in ("lad-1", "lad-2"):
        s = default[name]
        assert s["read_only"] is True and s["cap_drop"] == ["ALL"]
        assert "no-new-privileges:true" in s["security_opt"]
        assert {m.split(":")[0] for m in s["tmpfs"]} >= {"/tmp", "/home/lad"}
        grace_s = int(s["stop_grace_period"].rstrip("s"))
        assert grace_s >= float(s["environment"]["LAD_DRAIN_TIMEOUT_S"]) + 5
        for port in s["ports"]:
            assert port["host_ip"] == "127.0.0.1"  # published on loopback unless asked


def test_hf_cache_volume_is_mounted_at_the_image_hf_home(default: dict[str, Any]) -> None:
    hf_home = dockerfile_env()["HF_HOME"]
    for name in ("lad-1", "lad-2"):
        mounts = {v["target"]: v for v in default[name]["volumes"]}
        assert mounts[hf_home]["type"] == "volume" and mounts[hf_home]["source"] == "hf-cache"
        assert default[name]["environment"]["HF_HUB_OFFLINE"] == "1"


def test_gpu_profile_adds_a_cuda_replica_with_one_gpu(gpu: dict[str, Any]) -> None:
    s = gpu["lad-gpu"]
    assert s["build"]["args"] == {"TORCH_VARIANT": "cuda"} and s["image"] == "lad-serve:local-cuda"
    (device,) = s["deploy"]["resources"]["reservations"]["devices"]
    assert (device["driver"], device["count"], device["capabilities"]) == ("nvidia", 1, ["gpu"])
    assert s["environment"]["LAD_DEVICE"] == "cuda"
    assert s["environment"]["LAD_STORE_KEY_PREFIX"] != gpu["lad-1"]["environment"].get(
        "LAD_STORE_KEY_PREFIX", "lad"
    )
    assert "deploy" not in gpu["lad-1"] and "deploy" not in gpu["lad-2"]


def test_prometheus_loads_the_alert_rules_it_is_configured_with(default: dict[str, Any]) -> None:
    mounts = {
        v["target"]: Path(v["source"])
        for v in default["prometheus"]["volumes"]
        if v["type"] == "bind"
    }
    config_path = mounts["/etc/prometheus/prometheus.yml"]
    config = load_yaml(config_path)
    for rule_file in config["rule_files"]:
        target = f"/etc/prometheus/{rule_file}"
        assert mounts[target] == ROOT / "deploy" / "prometheus" / rule_file
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    names = {n for job in jobs.values() for sd in job["dns_sd_configs"] for n in sd["names"]}
    assert names == {"lad-1", "lad-2", "lad-gpu"}


def test_prometheus_sends_its_alerts_to_the_alertmanager_service(default: dict[str, Any]) -> None:
    mounts = {
        v["target"]: Path(v["source"])
        for v in default["prometheus"]["volumes"]
        if v["type"] == "bind"
    }
    config = load_yaml(mounts["/etc/prometheus/prometheus.yml"])
    (manager,) = config["alerting"]["alertmanagers"]
    (static,) = manager["static_configs"]
    (target,) = static["targets"]
    host, _, port = target.partition(":")
    assert host == "alertmanager" and "alertmanager" in default["prometheus"]["depends_on"]
    service = default["alertmanager"]
    assert service["image"].startswith("prom/alertmanager:")
    assert {p["target"] for p in service["ports"]} == {int(port)}
    assert all(p["host_ip"] == "127.0.0.1" for p in service["ports"])
    am_mounts = {v["target"]: Path(v["source"]) for v in service["volumes"] if v["type"] == "bind"}
    flag = next(a for a in service["command"] if a.startswith("--config.file="))
    am_config = am_mounts[flag.partition("=")[2]]
    assert am_config == ROOT / "deploy" / "alertmanager" / "alertmanager.yml"


def test_the_shipped_alertmanager_config_is_valid_and_delivers_nowhere() -> None:
    path = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
    done = run([tool("amtool"), "check-config", str(path)])
    assert "SUCCESS" in done.stdout
    config = load_yaml(path)
    (receiver,) = config["receivers"]
    assert receiver == {"name": config["route"]["receiver"]}  # no integration: a no-op
