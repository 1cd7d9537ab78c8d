"""The Go original's own configuration files (tests/fixtures/go-configs/, copied key by key from
its repository) start this broker, or stop it naming the one key it cannot honour."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from app.config import ConfigError, load_config
from devtools.pg import free_port
from tests.helpers.cli import Broker, clean_env

FIXTURES = Path(__file__).parent / "fixtures" / "go-configs"

# fixture: (the key it stops on as written, the [prune] retention it prunes with or None).
# As written, every Go sample names MySQL or listens on all interfaces without an admin token:
# those are the keys an operator changes when moving to this broker. A Go config that prunes
# must also carry its retention over to [pipeline] retention-days (app/config.py,
# _check_go_retention); every other Go key is accepted and logged as unused.
GO_CONFIGS = {
    "template.cfg": ("[http] admin-token", None),
    "helm-chart.cfg": ("[rdbms] dialect='mysql'", 300),
    "webhook-broker-integration-test.cfg": ("[rdbms] dialect='mysql'", 1),
    "webhook-broker-integration-test-hmac.cfg": ("[rdbms] dialect='mysql'", None),
    "webhook-broker-local-itest.cfg": ("[rdbms] dialect='mysql'", 1),
    "webhook-broker-local-itest-pruner.cfg": ("[rdbms] dialect='mysql'", 1),
    "webhook-broker-dc.cfg": ("[rdbms] dialect='mysql'", None),
}


def test_every_go_sample_is_covered() -> None:
    assert sorted(p.name for p in FIXTURES.glob("*.cfg")) == sorted(GO_CONFIGS)


def _moved(database: Path, port: int) -> dict[str, str]:
    """What an operator moving to this broker sets: our database, a listener we may open."""
    return {
        "WEBHOOK_BROKER__RDBMS__DIALECT": "sqlite",
        "WEBHOOK_BROKER__RDBMS__CONNECTION_URL": str(database),
        "WEBHOOK_BROKER__HTTP__LISTENER": f"127.0.0.1:{port}",
    }


@pytest.mark.parametrize("name", sorted(GO_CONFIGS))
def test_a_go_config_as_written_stops_naming_the_key(name: str) -> None:
    stops_on, _retention = GO_CONFIGS[name]
    with pytest.raises(ConfigError) as raised:
        load_config(FIXTURES / name, environ={}, search_default_locations=False)
    assert stops_on in str(raised.value)


@pytest.mark.parametrize("name", sorted(GO_CONFIGS))
def test_a_go_config_moved_to_our_database_starts_or_names_the_retention(
    name: str, tmp_path: Path
) -> None:
    _stops_on, retention = GO_CONFIGS[name]
    environ = _moved(tmp_path / "broker.sqlite3", free_port())
    if retention is not None:
        with pytest.raises(ConfigError) as raised:
            load_config(FIXTURES / name, environ=environ, search_default_locations=False)
        assert f"[prune] message-retention-days={retention}" in str(raised.value)
        assert "pipeline archive" in str(raised.value)
        environ["WEBHOOK_BROKER__PIPELINE__RETENTION_DAYS"] = str(retention)
    config = load_config(FIXTURES / name, environ=environ, search_default_locations=False)
    # The Go production values that used to stop the start are among those logged as unused.
    if "max-message-queue-size" in (FIXTURES / name).read_text():
        assert "[broker] max-message-queue-size" in config.ignored_keys
    if "[dlq]" in (FIXTURES / name).read_text():
        assert "[dlq] summary-update-interval-seconds" in config.ignored_keys


@pytest.mark.parametrize("name", sorted(GO_CONFIGS))
def test_a_go_config_moved_to_our_database_serves(name: str, tmp_path: Path) -> None:
    _stops_on, retention = GO_CONFIGS[name]
    (tmp_path / "home").mkdir()
    work = tmp_path / "work"
    work.mkdir()
    port = free_port()
    env = clean_env(tmp_path / "home", **_moved(work / "broker.sqlite3", port))
    if retention is not None:
        env["WEBHOOK_BROKER__PIPELINE__RETENTION_DAYS"] = str(retention)
    broker = Broker(["--config", str(FIXTURES / name), "serve"], work, env)
    try:
        broker.wait_ready(f"http://127.0.0.1:{port}")
        if "sample-channel" in (FIXTURES / name).read_text():
            # Its seeds were applied: the channel answers to its token.
            seeded = httpx.get(
                f"http://127.0.0.1:{port}/channel/sample-channel",
                headers={"X-Broker-Channel-Token": "sample-channel-token"},
            )
            assert seeded.status_code == 200, seeded.text
    finally:
        broker.stop()
