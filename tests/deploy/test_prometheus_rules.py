"""Alert rules, scrape configs and dashboard queries, checked by promtool.

`promtool check rules` and `promtool test rules` (deploy/prometheus/alerts_test.yml: each
alert fires on synthetic series); `promtool check config` for both scrape configs; every
dashboard query parsed by promtool as a rule expression; and the docs name every alert,
panel and series the rules and panels use.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import DASHBOARD, DEPLOY, PROMETHEUS, load_yaml, run, tool

RULES = load_yaml(PROMETHEUS / "alerts.yml")
README = (DEPLOY / "README.md").read_text()
ALERTS = [r for g in RULES["groups"] for r in g["rules"] if "alert" in r]
RECORDING = [r for g in RULES["groups"] for r in g["rules"] if "record" in r]
RECORDED = {r["record"] for r in RECORDING}
# Grafana's variables, replaced by what "All" and the default range stand for.
GRAFANA_VARIABLES = {
    "$n": ".*",
    "$profile": ".*",
    "$job": "lad-serve.*",
    "$instance": ".*",
    "$__rate_interval": "5m",
    "$__range": "1h",
}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SELECTOR = re.compile(
    r"(?<![:\w])(lad_[a-z_]+|lad:[a-z_0-9:]+|process_[a-z_]+|ALERTS|up)"
    r"(?:\{([^}]*)\})?(?![\w(])"
)


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_exprs() -> list[str]:
    exprs = [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]
    for name, value in GRAFANA_VARIABLES.items():
        exprs = [e.replace(name, value) for e in exprs]
    return exprs


def test_promtool_checks_the_rules() -> None:
    done = run([tool("promtool"), "check", "rules", "alerts.yml"], cwd=PROMETHEUS)
    assert f"SUCCESS: {len(ALERTS) + len(RECORDING)} rules found" in done.stdout


def test_promtool_unit_tests_pass() -> None:
    done = run([tool("promtool"), "test", "rules", "alerts_test.yml"], cwd=PROMETHEUS)
    assert "SUCCESS" in done.stdout


def test_every_alert_has_a_unit_test_where_it_fires() -> None:
    cases = load_yaml(PROMETHEUS / "alerts_test.yml")["tests"]
    fired = {
        t["alertname"] for case in cases for t in case.get("alert_rule_test", []) if t["exp_alerts"]
    }
    assert {a["alert"] for a in ALERTS} == fired


def test_every_alert_has_a_severity_a_summary_and_a_section_in_the_readme() -> None:
    for alert in ALERTS:
        assert alert["labels"]["severity"] in {"warning", "critical"}, alert["alert"]
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]
        assert f"`{alert['alert']}`" in README, f"{alert['alert']} is not in deploy/README.md"


def test_promtool_checks_the_compose_scrape_config() -> None:
    run([tool("promtool"), "check", "config", "prometheus.yml"], cwd=PROMETHEUS)


def test_promtool_checks_the_kubernetes_scrape_config(tmp_path: Path) -> None:
    """Debian's promtool is built without Kubernetes discovery: that block is swapped for
    a static target after checking it, and the rest (relabelling, rules) is checked."""
    config = load_yaml(PROMETHEUS / "prometheus-kubernetes.yml")
    (job,) = config["scrape_configs"]
    assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
    job["static_configs"] = [{"targets": ["lad:8000"]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    shutil.copy(PROMETHEUS / "alerts.yml", tmp_path / "alerts.yml")
    run([tool("promtool"), "check", "config", "prometheus.yml"], cwd=tmp_path)
    keep = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    assert keep[0]["regex"] == "lad-serve;server"  # the labels of deploy/k8s/deployment.yaml


def test_every_scrape_job_is_one_the_alerts_select() -> None:
    for name in ("prometheus.yml", "prometheus-kubernetes.yml"):
        for job in load_yaml(PROMETHEUS / name)["scrape_configs"]:
            assert re.fullmatch(r"lad-serve.*", job["job_name"]), (name, job["job_name"])


def test_dashboard_reads_its_data_source_from_a_variable() -> None:
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in board["panels"]:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        for target in panel.get("targets", []):
            assert target["datasource"] == DATASOURCE, panel["title"]
    for name in ("n", "profile", "job", "instance"):
        assert variables[name]["datasource"] == DATASOURCE, name
    assert '"uid": "prometheus"' not in DASHBOARD.read_text()  # no hard-coded data source


def test_every_dashboard_query_is_scoped_by_job_and_instance() -> None:
    """Every series selector of every panel carries the job and instance variables; the
    recorded drift series are per job (summed over its replicas), and job-wide alerts have
    no instance label, so ALERTS also matches an empty one."""
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    for name in ("job", "instance"):
        assert variables[name]["includeAll"] and variables[name]["multi"], name
    assert 'job=~"lad-serve.*"' in variables["instance"]["query"]["query"]
    assert "$job" in variables["instance"]["query"]["query"]
    for name in ("n", "profile"):
        query = variables[name]["query"]["query"]
        assert 'job=~"$job"' in query and 'instance=~"$instance"' in query, name
    selectors = 0
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            for series, matchers in SELECTOR.findall(target["expr"]):
                selectors += 1
                where = f"{panel['title']}: {series}"
                if series == "ALERTS":
                    assert 'job=~"$job|"' in matchers and 'instance=~"$instance|"' in matchers
                    continue
                assert 'job=~"$job"' in matchers, where
                if not series.startswith("lad:"):
                    assert 'instance=~"$instance"' in matchers, where
    assert selectors > 40


def test_gpu_panel_says_no_gpu_on_cpu_replicas() -> None:
    """CPU replicas export no lad_gpu_memory_bytes (absent, not 0): the GPU panel shows a
    "no GPU" text instead of "No data", and the GPU alert needs the series to fire."""
    (panel,) = [
        p
        for p in dashboard()["panels"]
        if any("lad_gpu_memory_bytes" in t["expr"] for t in p["targets"])
    ]
    assert "no GPU" in panel["fieldConfig"]["defaults"]["noValue"]
    (gpu_alert,) = [a for a in ALERTS if "lad_gpu_memory_bytes" in a["expr"]]
    assert "absent" not in gpu_alert["expr"]


def test_recorded_drift_series_keep_the_job() -> None:
    """Each job has its own profiles (lad-serve-gpu: another key prefix), and the drift
    panel filters by $job."""
    for rule in RECORDING:  # every aggregation of the recorded series keeps the job
        groupings = re.findall(r"\b(?:by|on) \(([^)]*)\)", rule["expr"])
        assert all(g.split(",")[0] == "job" for g in groupings), rule["record"]


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    exprs = dashboard_exprs()
    groups = [
        {
            "name": "dashboard",
            "rules": [{"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(exprs)],
        }
    ]
    (tmp_path / "dashboard.yml").write_text(yaml.safe_dump({"groups": groups}))
    done = run([tool("promtool"), "check", "rules", "dashboard.yml"], cwd=tmp_path)
    assert f"SUCCESS: {len(exprs)} rules found" in done.stdout


def test_dashboard_panels_are_unique_do_not_overlap_and_are_described() -> None:
    panels = dashboard()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells = set()
    for p in panels:
        g = p["gridPos"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & mine, f"panel {p['id']} overlaps another"
        cells |= mine
        assert f"**{p['title']}**" in README, f"panel {p['title']!r} is not in deploy/README.md"


def all_exprs() -> str:
    return " ".join([*dashboard_exprs(), *(r["expr"] for r in [*ALERTS, *RECORDING])])


def series_used() -> set[str]:
    """Every lad_* series the rules and panels read, histogram suffixes folded."""
    text = all_exprs()
    names = set(re.findall(r"(?<![:\w])lad_[a-z_]+", text))
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in names}


def test_readme_lists_exactly_the_series_the_rules_and_panels_use() -> None:
    table = README.split("### Series", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `(lad_[a-z_]+)`", table, flags=re.M))
    used = series_used()
    assert used, "no lad_* series found"
    assert listed == used, f"README only: {listed - used}; unlisted: {used - listed}"


@pytest.mark.parametrize("record", sorted(RECORDED))
def test_recorded_series_are_used(record: str) -> None:
    assert record in all_exprs()


def test_promtool_parses_the_adapter_queries(tmp_path: Path) -> None:
    """prometheus-adapter's metricsQuery templates, filled as the adapter fills them for
    one HPA request, are valid PromQL."""
    rules = load_yaml(PROMETHEUS / "prometheus-adapter-values.yaml")["rules"]["custom"]
    fill = {
        "<<.Series>>": "",
        "<<.LabelMatchers>>": 'namespace="ml", pod=~"lad-a|lad-b"',
        "<<.GroupBy>>": "pod",
    }
    exprs = []
    for rule in rules:
        expr = rule["metricsQuery"].replace("<<.Series>>", rule["name"]["as"])
        for name, value in fill.items():
            expr = expr.replace(name, value)
        assert "<<" not in expr, expr
        exprs.append(expr)
    groups = [
        {
            "name": "adapter",
            "rules": [{"record": f"adapter:query_{i}", "expr": e} for i, e in enumerate(exprs)],
        }
    ]
    (tmp_path / "adapter.yml").write_text(yaml.safe_dump({"groups": groups}))
    done = run([tool("promtool"), "check", "rules", "adapter.yml"], cwd=tmp_path)
    assert f"SUCCESS: {len(exprs)} rules found" in done.stdout
