"""A real broker process (`python -m app serve`) on a free loopback port, on SQLite and on
PostgreSQL, with a channel, a producer and a pull consumer made through the client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.conftest import fresh_database
from tests.helpers.processes import BrokerProcess, Setup, channel_with_consumer

EXTRA_CONFIG = "[broker]\nmax-retry=5\nretry-backoff-delays-in-seconds=1\n"


def _process(rdbms: str, workdir: Path, extra: str = "") -> BrokerProcess:
    config = workdir / "broker.cfg"
    config.write_text(rdbms + EXTRA_CONFIG + extra)
    process = BrokerProcess(config)
    process.start()
    return process


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def shared_process(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    """One broker process for a module's tests on one backend (each test has channels of its
    own): a process start per test would cost more than the tests."""
    backend = str(request.param)
    if backend == "postgresql":
        request.getfixturevalue("pg_template")
        section = fresh_database(backend, request.getfixturevalue("pg_base_url"), None)
    else:
        section = fresh_database(backend, None, request.getfixturevalue("sqlite_template"))
    process = _process(section, tmp_path_factory.mktemp(f"broker-{backend}"))
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def private_config() -> str:
    """Configuration the test's own process adds to the module's (a test parametrizes it)."""
    return ""


@pytest.fixture
def private_process(rdbms: str, tmp_path: Path, private_config: str) -> Iterator[BrokerProcess]:
    """A broker process of the test's own, for a test that stops or pauses it."""
    process = _process(rdbms, tmp_path, private_config)
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def consumer_settings() -> dict[str, str]:
    return {}


@pytest.fixture
async def setup(
    shared_process: BrokerProcess, consumer_settings: dict[str, str]
) -> AsyncIterator[Setup]:
    async with channel_with_consumer(shared_process, consumer_settings) as made:
        yield made


@pytest.fixture
async def private_setup(
    private_process: BrokerProcess, consumer_settings: dict[str, str]
) -> AsyncIterator[Setup]:
    async with channel_with_consumer(private_process, consumer_settings) as made:
        yield made
