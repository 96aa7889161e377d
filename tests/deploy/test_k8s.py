"""deploy/k8s rendered by `kubectl kustomize` and validated by kubernetes-validate.

Every rendered resource (the base, the base with both optional components, and the
fill-model-cache overlay) is validated strictly against the oldest and the newest
Kubernetes versions named below; then the checks read what a cluster would run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.conftest import (
    K8S,
    PROMETHEUS,
    dockerfile_env,
    dockerfile_uid,
    load_env_file,
    load_yaml,
    run,
    tool,
)

VERSIONS = ("1.29.0", "1.37.0")
CUSTOM_KINDS = {"PodMonitor"}  # Prometheus Operator CRD: no schema in kubernetes-validate


def render(folder: Path) -> list[dict[str, Any]]:
    done = run([tool("kubectl"), "kustomize", str(folder)])
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="module")
def base() -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in render(K8S)}


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict[str, Any]]:
    """The base with every component of deploy/k8s/components enabled."""
    overlay = tmp_path_factory.mktemp("overlay")
    rel = os.path.relpath(K8S, overlay)
    components = sorted(p.name for p in (K8S / "components").iterdir())
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [rel],
                "components": [f"{rel}/components/{c}" for c in components],
            }
        )
    )
    return {(d["kind"], d["metadata"]["name"]): d for d in render(overlay)}


def validate(resources: list[dict[str, Any]]) -> None:
    for resource in resources:
        for version in VERSIONS:
            try:
                kubernetes_validate.validate(resource, version, strict=True)
            except kubernetes_validate.SchemaNotFoundError:
                assert resource["kind"] in CUSTOM_KINDS, resource["kind"]
            except kubernetes_validate.ValidationError as exc:
                name = f"{resource['kind']}/{resource['metadata']['name']}"
                pytest.fail(f"{name} is invalid for Kubernetes {version}: {exc.message}")


def test_every_rendered_manifest_is_valid(full: dict, base: dict) -> None:
    assert set(base) < set(full)
    validate(list(full.values()))
    validate(render(K8S / "fill-model-cache"))


def pod_spec(resources: dict) -> dict[str, Any]:
    return resources[("Deployment", "lad")]["spec"]["template"]["spec"]


def test_pod_runs_non_root_read_only_without_capabilities(base: dict) -> None:
    spec = pod_spec(base)
    uid = dockerfile_uid()
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == uid
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False  # no LAD_PORT=tcp://... from Service "lad"
    (container,) = spec["containers"]
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["runAsUser"] == uid


def test_writable_paths_are_volumes_and_weights_come_read_only_from_the_pvc(base: dict) -> None:
    spec = pod_spec(base)
    (container,) = spec["containers"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    env = dockerfile_env()
    store_dir = str(Path(env["LAD_STORE_URL"]).parent)
    for path in (store_dir, "/tmp", env["HOME"]):
        assert "emptyDir" in volumes[mounts[path]["name"]], path
    cache = mounts[env["HF_HOME"]]
    assert cache["readOnly"] is True
    claim = volumes[cache["name"]]["persistentVolumeClaim"]["claimName"]
    assert ("PersistentVolumeClaim", claim) in base


def test_probes_and_drain_bound(base: dict) -> None:
    spec = pod_spec(base)
    (container,) = spec["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == "/healthz"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # big models load slowly
    config = base_config(base)
    pre_stop_s = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    drain_s = float(config["LAD_DRAIN_TIMEOUT_S"])
    assert spec["terminationGracePeriodSeconds"] >= pre_stop_s + drain_s + 5


def base_config(resources: dict) -> dict[str, str]:
    (config,) = [r for (kind, _), r in resources.items() if kind == "ConfigMap"]
    return config["data"]


def test_config_and_tokens_are_generated_and_referenced(base: dict) -> None:
    (container,) = pod_spec(base)["containers"]
    refs = {next(iter(ref)): next(iter(ref.values())) for ref in container["envFrom"]}
    secret = base[("Secret", refs["secretRef"]["name"])]
    assert refs["secretRef"].get("optional") is not True
    assert set(secret["data"]) == {"LAD_ADMIN_TOKEN", "LAD_RETRIEVE_TOKEN"}
    assert set(secret["data"]) == set(load_env_file(K8S / "tokens.env"))
    # The shipped placeholder is empty: the service refuses to start until it is replaced.
    assert all(value == "" for value in secret["data"].values())
    config = base[("ConfigMap", refs["configMapRef"]["name"])]["data"]
    assert config == load_env_file(K8S / "config.env")
    assert config["LAD_HOST"] == "0.0.0.0" and config["HF_HUB_OFFLINE"] == "1"
    assert config["LAD_STORE_URL"].startswith("redis://lad-redis:")


def test_image_is_set_by_the_kustomization(base: dict) -> None:
    images = load_yaml(K8S / "kustomization.yaml")["images"]
    (image,) = images
    (container,) = pod_spec(base)["containers"]
    assert container["image"] == f"{image['newName']}:{image['newTag']}"
    fill = load_yaml(K8S / "fill-model-cache" / "kustomization.yaml")["images"]
    assert fill == images


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_service_pdb_hpa_and_monitor_point_at_the_pods(full: dict) -> None:
    deployment = full[("Deployment", "lad")]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"] for p in container["ports"]}
    service = full[("Service", "lad")]
    assert selects(service["spec"]["selector"], labels)
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    pdb = full[("PodDisruptionBudget", "lad")]
    assert selects(pdb["spec"]["selector"]["matchLabels"], labels)
    hpa = full[("HorizontalPodAutoscaler", "lad")]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "lad"}
    assert hpa["minReplicas"] >= 2  # with maxUnavailable 1, a drain keeps one replica
    resource = [m["resource"]["name"] for m in hpa["metrics"] if m["type"] == "Resource"]
    assert resource == ["cpu"]  # added by the hpa-cpu component
    monitor = full[("PodMonitor", "lad")]["spec"]
    assert selects(monitor["selector"]["matchLabels"], labels)
    (endpoint,) = monitor["podMetricsEndpoints"]
    assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
    assert {"targetLabel": "job", "replacement": "lad-serve"} in endpoint["relabelings"]
    redis_labels = full[("StatefulSet", "lad-redis")]["spec"]["template"]["metadata"]["labels"]
    policy = full[("NetworkPolicy", "lad-redis")]["spec"]
    assert selects(policy["podSelector"]["matchLabels"], redis_labels)
    (rule,) = policy["ingress"]
    assert selects(rule["from"][0]["podSelector"]["matchLabels"], labels)


def test_base_hpa_scales_the_gpu_pods_on_backlog_not_cpu(base: dict) -> None:
    metrics = base[("HorizontalPodAutoscaler", "lad")]["spec"]["metrics"]
    assert {m["type"] for m in metrics} == {"Pods"}
    names = [m["pods"]["metric"]["name"] for m in metrics]
    assert names == ["lad_queue_depth", "lad_requests_in_flight"]
    for m in metrics:
        assert m["pods"]["target"]["type"] == "AverageValue"
        assert float(m["pods"]["target"]["averageValue"]) > 0
    (container,) = pod_spec(base)["containers"]
    assert "nvidia.com/gpu" in container["resources"]["limits"]  # the pods it scales are GPU pods


def test_every_hpa_pods_metric_is_served_by_an_adapter_rule_on_an_exported_series(
    full: dict,
) -> None:
    """prometheus-adapter-values.yaml serves each pods metric the HPA reads, from a series
    that app.observability.metrics really exports, per namespace and pod."""
    from app.observability.metrics import Metrics

    exported = {m.name for m in Metrics().registry.collect()}
    rules = load_yaml(PROMETHEUS / "prometheus-adapter-values.yaml")["rules"]["custom"]
    served = {rule["name"]["as"]: rule for rule in rules}
    metrics = full[("HorizontalPodAutoscaler", "lad")]["spec"]["metrics"]
    pods = [m["pods"]["metric"]["name"] for m in metrics if m["type"] == "Pods"]
    assert pods
    for name in pods:
        rule = served[name]
        series = rule["seriesQuery"].split("{")[0]
        assert series == name and series in exported, name
        assert rule["resources"]["overrides"] == {
            "namespace": {"resource": "namespace"},
            "pod": {"resource": "pod"},
        }
        assert "<<.Series>>{<<.LabelMatchers>>}" in rule["metricsQuery"]
        assert "<<.GroupBy>>" in rule["metricsQuery"]
