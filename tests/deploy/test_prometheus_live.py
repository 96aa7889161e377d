"""Debian's Prometheus scraping a live `lad serve` under a little traffic, with alerts.yml
loaded: every query of the dashboard and every rule evaluates, every rule is healthy, and
the core panels return data.

Bounded: the service and Prometheus each get a start deadline, the traffic is a fixed
handful of requests, Prometheus is stopped by its PID.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from lad_lab.bench.live import free_port
from lad_lab.demo.world import make_items
from tests.api.helpers import calibration_body, retrieve_body
from tests.deploy.conftest import PROMETHEUS, tool
from tests.deploy.test_prometheus_rules import ALERTS, RECORDING, dashboard
from tests.live import LiveService

# Grafana's variables, as the whole dashboard sees them with "All" selected. The rate
# window is 1m (wide enough for a 2 s scrape and a minute of data).
GRAFANA = {
    "$n": ".*",
    "$profile": ".*",
    "$job": "lad-serve.*",
    "$instance": ".*",
    "$__rate_interval": "1m",
    "$__range": "1h",
}

# Panels that must show data after the traffic below (GPU memory: a CPU replica has none;
# alerts: none fire; drift: computed, but the debiased share may be inside its noise).
EMPTY_ALLOWED = {"GPU memory per replica", "Alerts firing"}


def panel_queries() -> list[tuple[str, str]]:
    out = []
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in GRAFANA.items():
                expr = expr.replace(name, value)
            out.append((panel["title"], expr))
    return out


class Prometheus:
    """`prometheus` scraping ``target`` every 2 s, evaluating alerts.yml every second."""

    def __init__(self, workdir: Path, target: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        shutil.copy(PROMETHEUS / "alerts.yml", workdir / "alerts.yml")
        config = {
            # 2 s: a scrape may take over a second on a loaded machine (timeout = interval)
            "global": {"scrape_interval": "2s", "evaluation_interval": "1s"},
            "rule_files": ["alerts.yml"],
            "scrape_configs": [
                {"job_name": "lad-serve", "static_configs": [{"targets": [target]}]}
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.workdir = workdir
        self.log = workdir / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> None:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    tool("prometheus"),
                    "--config.file=prometheus.yml",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                cwd=self.workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while not self._answers("/-/ready"):
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, "prometheus was not ready in time"
            time.sleep(0.2)

    def _answers(self, path: str) -> bool:
        try:
            return httpx.get(self.url + path, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def query(self, expr: str) -> dict[str, Any]:
        return httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=30).json()

    def wait_for(self, expr: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not self.query(expr)["data"]["result"]:
            assert time.monotonic() < deadline, f"{expr} returned nothing in {timeout} s"
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # by PID: the process this object started
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def traffic(url: str, prometheus: Prometheus) -> None:
    """A calibration, debiased and vanilla answers, a perm_avg, a fallback, a 4xx.

    One debiased answer goes first and is scraped before the rest: `increase()` needs a
    counter series to be seen at least twice, and a series born between two scrapes
    shows no increase at all (in production the counters live long; here they are new).
    """
    items = make_items(6, n_candidates=4, seed="eval")
    with httpx.Client(base_url=url, timeout=120) as http:
        calibration = calibration_body(make_items(3, n_candidates=4, seed="calibration"))
        assert http.post("/v1/calibrate", json=calibration).status_code == 200
        assert http.post("/v1/retrieve", json=retrieve_body(items[0])).status_code == 200
        prometheus.wait_for('lad_predicted_position_total{kind="raw"}')
        for item in items:
            assert http.post("/v1/retrieve", json=retrieve_body(item)).status_code == 200
        for method in ("vanilla", "perm_avg", "pride"):
            assert (
                http.post("/v1/retrieve", json=retrieve_body(items[0], method=method)).status_code
                == 200
            )
        fallback = retrieve_body(items[0], profile="uncalibrated")
        assert http.post("/v1/retrieve", json=fallback).json()["debiased"] is False
        assert http.post("/v1/retrieve", json={"query": "x", "images": ["a"]}).status_code == 422
        http.get("/v1/profiles")


@pytest.mark.slow
def test_prometheus_evaluates_every_dashboard_query_and_rule_on_a_live_service(tmp_path):
    prom_dir = tmp_path / "prometheus"
    prom_dir.mkdir()
    service = LiveService(
        tmp_path, {"LAD_FALLBACK_TO_VANILLA": "true", "LAD_OVERHEAD_SAMPLE_RATE": "1"}
    )
    prometheus = Prometheus(prom_dir, f"127.0.0.1:{service.port}")
    try:
        service.start()
        prometheus.start()
        prometheus.wait_for('up{job="lad-serve"} == 1')
        traffic(service.url, prometheus)
        # two more scrapes after the traffic, and the recording rules evaluated on them
        prometheus.wait_for('count_over_time(up{job="lad-serve"}[1m]) >= 5')
        prometheus.wait_for('lad:position_drift:1h{kind="raw"}')
        failures, empty = [], []
        for title, expr in panel_queries():
            answer = prometheus.query(expr)
            if answer["status"] != "success":
                failures.append((title, expr, answer.get("error")))
            elif not answer["data"]["result"] and title not in EMPTY_ALLOWED:
                empty.append((title, expr))
        for rule in [*ALERTS, *RECORDING]:
            answer = prometheus.query(rule["expr"])
            if answer["status"] != "success":
                failures.append(
                    (rule.get("alert") or rule["record"], rule["expr"], answer.get("error"))
                )
        groups = httpx.get(f"{prometheus.url}/api/v1/rules", timeout=10).json()["data"]
        rules = [r for g in groups["groups"] for r in g["rules"]]
        unhealthy = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    finally:
        prometheus.stop()
        service.stop()
    assert not failures, failures
    assert not empty, f"core panels without data: {empty}"
    assert len(rules) == len(ALERTS) + len(RECORDING)
    assert not unhealthy, unhealthy
