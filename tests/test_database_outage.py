"""A database that cannot be reached makes every request one to retry: 503 with Retry-After
and a reason, never a 500 (the chaos suite restarts PostgreSQL under load; this pins the
answer on each kind of route)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import httpx
import pytest

from app.api.app import create_app
from app.config import load_config_text
from app.domain.errors import Unavailable
from app.roots import process as process_module
from app.runtime import Runtime
from devtools.pg import free_port

AUTH = {"X-Broker-Channel-Token": "ct", "X-Broker-Consumer-Token": "kt"}
PRODUCER = {
    "X-Broker-Channel-Token": "ct",
    "X-Broker-Producer-ID": "p1",
    "X-Broker-Producer-Token": "pt",
}


@pytest.fixture
async def unreachable() -> AsyncIterator[httpx.AsyncClient]:
    """The API of a broker whose PostgreSQL listens nowhere (a port nothing holds)."""
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/broker"
    config = load_config_text(f"[rdbms]\ndialect=postgresql\nconnection-url={url}\n")
    runtime = Runtime(config)
    transport = httpx.ASGITransport(app=create_app(config, runtime))
    async with httpx.AsyncClient(transport=transport, base_url="http://broker.test") as client:
        yield client
    await runtime.stop()


@pytest.mark.parametrize(
    ("method", "path", "kwargs"),
    [
        ("POST", "/channel/c1/broadcast", {"content": b"x", "headers": PRODUCER}),
        ("POST", "/channel/c1/consumer/k1/pull", {"json": {"no_wait": True}, "headers": AUTH}),
        ("POST", "/channel/c1/consumer/k1/job/1/ack", {"json": {}, "headers": AUTH}),
        ("PUT", "/channel/c1", {"data": {"token": "ct"}}),
        ("GET", "/channel/c1/consumers", {}),
        ("GET", "/job-status", {}),
    ],
)
async def test_an_unreachable_database_answers_503_with_retry_after(
    unreachable: httpx.AsyncClient, method: str, path: str, kwargs: dict[str, object]
) -> None:
    r = await unreachable.request(method, path, **kwargs)  # type: ignore[arg-type]
    assert r.status_code == 503, r.text
    assert r.headers["Retry-After"] == "1"
    assert r.json() == {"error": 503, "detail": "the database is unavailable; retry"}


async def test_a_process_starting_without_its_database_waits_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Started while the database restarts, a process waits (START_WAIT_SECONDS) before it
    gives up, rather than exiting at once (the chaos suite started an API in an outage)."""
    monkeypatch.setattr(process_module, "START_WAIT_SECONDS", 1.5)
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/broker"
    runtime = Runtime(load_config_text(f"[rdbms]\ndialect=postgresql\nconnection-url={url}\n"))
    started = time.monotonic()
    with pytest.raises(Unavailable):
        await runtime.start()
    assert time.monotonic() - started >= 1.5
    await runtime.stop()
