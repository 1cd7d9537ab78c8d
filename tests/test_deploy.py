"""deploy/ and the Dockerfile, checked without a Docker engine (there is none on our machines):
the compose file parses; every broker service runs a real CLI command; its mounted config and
environment load as the broker loads them; ports, health checks and scrape targets agree with
that config; the alert rules name metrics /metrics serves; the image installs what CI installs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.config import load_config_text

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
COMPOSE = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
BROKER = {name: s for name, s in SERVICES.items() if s.get("image") == "webhook-broker:latest"}
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def test_every_process_kind_is_there() -> None:
    commands = sorted(s["command"][0] for s in BROKER.values())
    assert commands == ["api", "api", "bridge", "dispatcher", "dispatcher", "migrate", "sweeper"]
    assert {"postgres", "nats", "prometheus"} <= set(SERVICES)


@pytest.mark.parametrize("name", sorted(BROKER))
def test_each_command_is_a_real_cli_command(name: str) -> None:
    command = BROKER[name]["command"]
    done = subprocess.run(
        [sys.executable, "-m", "app", *command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("name", sorted(BROKER))
def test_the_config_and_environment_load(name: str) -> None:
    environment = BROKER[name]["environment"]
    assert all(key.startswith("WEBHOOK_BROKER__") for key in environment)
    mounted = (DEPLOY / "webhook-broker.cfg").read_text()
    config = load_config_text(mounted, environ=environment)
    assert config.database.dialect == "postgresql"
    assert config.database.connection_url == environment["WEBHOOK_BROKER__RDBMS__CONNECTION_URL"]
    assert config.nats.url == environment["WEBHOOK_BROKER__NATS__URL"]
    mount = BROKER[name]["volumes"][0].split(":")
    assert mount[1] == "/etc/webhook-broker/webhook-broker.cfg"


def test_ports_health_checks_and_scrape_targets_agree_with_the_config() -> None:
    environment = BROKER["api1"]["environment"]
    config = load_config_text((DEPLOY / "webhook-broker.cfg").read_text(), environ=environment)
    port = config.http.port
    apis = sorted(name for name, s in BROKER.items() if s["command"] == ["api"])
    for name in apis:
        assert all(p.endswith(f":{port}") for p in BROKER[name]["ports"]), name
    # The image's health check asks /_status on that port; processes without HTTP turn it off.
    assert f"http://127.0.0.1:{port}/_status" in DOCKERFILE
    for name, service in BROKER.items():
        if service["command"][0] in ("sweeper", "dispatcher", "bridge"):
            assert service["healthcheck"] == {"disable": True}, name
    prometheus = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    api_job, worker_job = prometheus["scrape_configs"]
    assert api_job["metrics_path"] == worker_job["metrics_path"] == "/metrics"
    assert sorted(api_job["static_configs"][0]["targets"]) == [f"{n}:{port}" for n in apis]
    # The workers serve /metrics on their [metrics] listener, set in their environment.
    workers = sorted(
        n for n, s in BROKER.items() if s["command"][0] in ("sweeper", "dispatcher", "bridge")
    )
    targets = []
    for name in workers:
        env = BROKER[name]["environment"]
        worker = load_config_text((DEPLOY / "webhook-broker.cfg").read_text(), environ=env)
        assert worker.metrics.listener is not None, name
        targets.append(f"{name}:{worker.metrics.listener[1]}")
    assert sorted(worker_job["static_configs"][0]["targets"]) == targets


def test_alert_rules_name_metrics_that_exist() -> None:
    served = set(re.findall(r'"(webhook_broker_[a-z_]+)"', (ROOT / "app/metrics.py").read_text()))
    rules = yaml.safe_load((DEPLOY / "alerts.yml").read_text())["groups"][0]["rules"]
    assert rules
    for rule in rules:
        named = {
            re.sub(r"_(count|sum|bucket|total)$", "", name)
            for name in re.findall(r"webhook_broker_[a-z_]+", rule["expr"])
        }
        assert named and named <= served, (rule["alert"], named - served)


def test_the_image_installs_the_package_ci_installs() -> None:
    # CI installs the checkout (pip install -e '.[dev]'); the image builds a wheel of the same
    # tree: it must copy what the wheel is made of.
    for path in ("pyproject.toml", "README.md", "app", "migrations"):
        assert re.search(rf"^COPY .*\b{re.escape(path)}\b", DOCKERFILE, re.M), path
    assert "pip wheel --no-deps --wheel-dir /wheels ." in DOCKERFILE
    assert re.search(r"^USER broker$", DOCKERFILE, re.M)
    assert 'ENTRYPOINT ["webhook-broker"]' in DOCKERFILE and 'CMD ["serve"]' in DOCKERFILE
    assert "FROM broker AS pipeline" in DOCKERFILE and "libpostgresql-jdbc-java" in DOCKERFILE


def test_the_grafana_dashboard_charts_served_metrics() -> None:
    served = set(re.findall(r'"(webhook_broker_[a-z_]+)"', (ROOT / "app/metrics.py").read_text()))
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    assert dashboard["panels"]
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            named = {
                re.sub(r"_(count|sum|bucket|total)$", "", name)
                for name in re.findall(r"webhook_broker_[a-z_]+", target["expr"])
            }
            assert named and named <= served, (panel["title"], named - served)
