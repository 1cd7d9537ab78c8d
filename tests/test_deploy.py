"""deploy/ and the Dockerfile, checked without a Docker engine (there is none on our machines):
the compose file parses; every broker service runs a real CLI command; its mounted config and
environment load as the broker loads them; ports, health checks and scrape targets agree with
that config; the alert rules name metrics /metrics serves; the image installs what CI installs;
every secret comes from deploy/.env (documented in .env.example); only the API is published;
nats-server loads its users as `webhook-broker nats-permissions` writes them; Grafana's
provisioning names the dashboard and Prometheus there are."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cli_nats import permissions_text
from app.config import SECTIONS, load_config_text
from tests.helpers.natsproc import nats_server_binary

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
COMPOSE_TEXT = (DEPLOY / "compose.yaml").read_text()
COMPOSE = yaml.safe_load(COMPOSE_TEXT)
SERVICES: dict[str, Any] = COMPOSE["services"]
BROKER = {name: s for name, s in SERVICES.items() if s.get("image") == "webhook-broker:latest"}
DOCKERFILE = (ROOT / "Dockerfile").read_text()

# Compose's interpolation: `${VAR:?message}` (required: unset or empty stops compose).
REQUIRED = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*):\?[^}]*\}")
ANY_REFERENCE = re.compile(r"\$\{?[A-Za-z_]")
DOCUMENTED = re.findall(r"^([A-Z][A-Z0-9_]*)=", (DEPLOY / ".env.example").read_text(), re.M)
# What an operator's deploy/.env would hold.
SAMPLE_ENV = {name: f"sample-{name.lower().replace('_', '-')}" for name in DOCUMENTED}


def interpolate(value: Any) -> str:
    return REQUIRED.sub(lambda m: SAMPLE_ENV[m.group(1)], str(value))


def environment_of(service: dict[str, Any]) -> dict[str, str]:
    return {key: interpolate(value) for key, value in service["environment"].items()}


def test_every_process_kind_is_there() -> None:
    commands = sorted(s["command"][0] for s in BROKER.values())
    assert commands == ["api", "api", "bridge", "dispatcher", "dispatcher", "migrate", "sweeper"]
    assert {"postgres", "nats", "prometheus", "grafana"} <= set(SERVICES)


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
    environment = environment_of(BROKER[name])
    assert all(key.startswith("WEBHOOK_BROKER__") for key in environment)
    mounted = (DEPLOY / "webhook-broker.cfg").read_text()
    config = load_config_text(mounted, environ=environment)
    assert config.database.dialect == "postgresql"
    assert config.database.connection_url == environment["WEBHOOK_BROKER__RDBMS__CONNECTION_URL"]
    assert config.nats.url == environment["WEBHOOK_BROKER__NATS__URL"]
    mount = BROKER[name]["volumes"][0].split(":")
    assert mount[1] == "/etc/webhook-broker/webhook-broker.cfg"


def test_ports_health_checks_and_scrape_targets_agree_with_the_config() -> None:
    environment = environment_of(BROKER["api1"])
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
        env = environment_of(BROKER[name])
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
    for path in ("pyproject.toml", "README.md", "app", "clients/python"):
        assert re.search(rf"^COPY .*\b{re.escape(path)}\b", DOCKERFILE, re.M), path
    assert "pip wheel --no-deps --wheel-dir /wheels ./clients/python ." in DOCKERFILE
    # its dependencies from the lock, hashes checked; its own two wheels on top
    assert "pip install --require-hashes -r /tmp/requirements.lock" in DOCKERFILE
    assert "pip install --no-deps /wheels/*.whl && pip check" in DOCKERFILE
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


# -- secure by default --------------------------------------------------------------------------

SECRET_KEYS = {
    f"WEBHOOK_BROKER__{section.name}__{key.name}".upper().replace("-", "_")
    for section in SECTIONS
    for key in section.keys
    if key.secret
}


def test_every_secret_comes_from_the_env_file_and_is_required() -> None:
    # Every variable the file reads is required (`:?`), and documented in .env.example.
    references = ANY_REFERENCE.findall(COMPOSE_TEXT)
    required = REQUIRED.findall(COMPOSE_TEXT)
    assert references and len(references) == len(required), "a reference without :?"
    assert set(required) == set(DOCUMENTED)
    # What the broker takes as a secret is set in its environment from there, never in clear.
    for name, service in BROKER.items():
        environment = service["environment"]
        for key in ("WEBHOOK_BROKER__HTTP__ADMIN_TOKEN", "WEBHOOK_BROKER__NATS__PASSWORD"):
            assert REQUIRED.fullmatch(environment[key]), (name, key)
        for key in SECRET_KEYS & set(environment):
            assert REQUIRED.fullmatch(environment[key]), (name, key)
        assert REQUIRED.search(environment["WEBHOOK_BROKER__RDBMS__CONNECTION_URL"]), name
        config = load_config_text(
            (DEPLOY / "webhook-broker.cfg").read_text(), environ=environment_of(service)
        )
        assert config.http.admin_token == SAMPLE_ENV["WEBHOOK_BROKER_ADMIN_TOKEN"]
        assert config.nats.password == SAMPLE_ENV["NATS_BRIDGE_PASSWORD"]
    # The other services' passwords as well; no password or token is written in the file.
    for name, service in SERVICES.items():
        for key, value in (service.get("environment") or {}).items():
            if re.search(r"PASSWORD|TOKEN|SECRET|HASH_KEY", key):
                assert REQUIRED.search(str(value)), (name, key)
    assert SERVICES["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith(
        "${POSTGRES_PASSWORD:?"
    )
    assert SERVICES["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"].startswith(
        "${GRAFANA_ADMIN_PASSWORD:?"
    )
    # The filled-in files stay out of git.
    ignored = (DEPLOY / ".gitignore").read_text().split()
    assert ".env" in ignored and "nats-workers.env" in ignored


def test_only_the_api_is_published() -> None:
    published = {name for name, service in SERVICES.items() if service.get("ports")}
    assert published and all(BROKER.get(name, {}).get("command") == ["api"] for name in published)
    for service in SERVICES.values():
        assert "network_mode" not in service  # every service on the compose network
    # The operator's override adds ports on this host's loopback only.
    local = yaml.safe_load((DEPLOY / "compose.local.yaml").read_text())["services"]
    for name, service in local.items():
        assert name in SERVICES
        assert all(port.startswith("127.0.0.1:") for port in service["ports"]), name


def _mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> the file or directory of deploy/ mounted there (read-only)."""
    mounts = {}
    for volume in service["volumes"]:
        source, target, mode = volume.split(":")
        assert mode == "ro", volume
        mounts[target] = (DEPLOY / source).resolve()
    return mounts


def test_nats_server_loads_the_users_nats_permissions_writes() -> None:
    nats = SERVICES["nats"]
    assert "-js" not in nats["command"]  # the bridge answers the JetStream API
    config_path = nats["command"][nats["command"].index("-c") + 1]
    mounts = _mounts(nats)
    conf = mounts[config_path]
    included = re.findall(r"^include\s+(\S+)", conf.read_text(), re.M)
    assert included == ["nats-permissions.conf"]
    permissions = mounts[str(Path(config_path).parent / included[0])]
    # What `webhook-broker nats-permissions` prints for the bridge's config and no consumers.
    bridge = environment_of(BROKER["bridge"])
    config = load_config_text((DEPLOY / "webhook-broker.cfg").read_text(), environ=bridge)
    expected, _ = permissions_text(config, [])
    assert permissions.read_text().endswith(expected)
    assert f'user: "{config.nats.user}"' in expected
    # nats-server gets the bridge's password from the same .env variable as the broker.
    assert nats["environment"]["NATS_BRIDGE_PASSWORD"].startswith("${NATS_BRIDGE_PASSWORD:?")
    assert [e["path"] for e in nats["env_file"]] == ["./nats-workers.env"]
    # And the real nats-server accepts the files, with the password from its environment.
    done = subprocess.run(
        [nats_server_binary(), "-t", "-c", str(conf)],
        env={**os.environ, "NATS_BRIDGE_PASSWORD": "sample"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_grafana_is_provisioned_with_the_dashboard_and_prometheus() -> None:
    grafana = SERVICES["grafana"]
    mounts = _mounts(grafana)
    provisioning = mounts["/etc/grafana/provisioning"]
    assert provisioning.is_dir()
    [datasources] = (provisioning / "datasources").glob("*.yaml")
    [source] = yaml.safe_load(datasources.read_text())["datasources"]
    prometheus = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    assert source["isDefault"] is True
    # The alert rules are Prometheus's (alerts.yml); Grafana lists them through the source.
    assert source["jsonData"]["manageAlerts"] is True
    assert "/etc/prometheus/alerts.yml" in prometheus["rule_files"]
    assert _mounts(SERVICES["prometheus"])["/etc/prometheus/alerts.yml"] == (DEPLOY / "alerts.yml")
    [dashboards] = (provisioning / "dashboards").glob("*.yaml")
    [provider] = yaml.safe_load(dashboards.read_text())["providers"]
    folder = provider["options"]["path"]
    dashboard_files = [
        path for target, path in mounts.items() if str(Path(target).parent) == folder
    ]
    assert dashboard_files == [DEPLOY / "grafana-dashboard.json"]
    dashboard = json.loads(dashboard_files[0].read_text())
    # Its panels' data source variable resolves to a Prometheus source: the provisioned one.
    [variable] = dashboard["templating"]["list"]
    assert variable["type"] == "datasource" and variable["query"] == source["type"]
    assert all(
        panel["datasource"]["uid"] == "${" + variable["name"] + "}" for panel in dashboard["panels"]
    )
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
