"""Connections that sat unused ([rdbms] connxn-max-idle-time-seconds, IDLE_PING_SECONDS): the pool
and the held connections hand out the connection returned last first, so the ones beneath sit
through every lull, where a server, a pooler or a NAT may drop them. Checked (or replaced) before
they go out again, on a real PostgreSQL whose backends the test terminates; the clock is the
test's own, so nothing waits."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

from app.config import load_config_text
from app.store.db import IDLE_PING_SECONDS, Held, create_engine, idle_verdict

pytestmark = pytest.mark.parametrize("backend", ["postgresql"])


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("idle", "max_idle", "verdict"),
    [
        (0.0, 0, "use"),
        (IDLE_PING_SECONDS - 0.1, 0, "use"),
        (IDLE_PING_SECONDS, 0, "ping"),
        (10 * IDLE_PING_SECONDS, 0, "ping"),  # no limit: checked, never replaced for its age
        (5.0, 5, "use"),
        (5.1, 5, "replace"),
        (IDLE_PING_SECONDS + 1, 30, "replace"),
        (IDLE_PING_SECONDS + 1, 3600, "ping"),
    ],
)
def test_idle_verdict(backend: str, idle: float, max_idle: float, verdict: str) -> None:
    assert idle_verdict(idle, max_idle) == verdict


def _terminate(url: str, pid: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))


async def _pid(engine: Any) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())


async def test_a_pooled_connection_dropped_while_idle_is_replaced_not_failed(
    backend: str, rdbms: str
) -> None:
    config = load_config_text(rdbms).database
    clock = Clock()
    engine = create_engine(replace(config, pool_size=1, max_overflow=0), clock=clock)
    try:
        first = await _pid(engine)
        _terminate(config.connection_url, first)
        # Used again soon after: handed out unchecked (the hot path pays nothing), and the
        # dropped connection fails its statement once, as before.
        clock.now += 1
        with pytest.raises(Exception):  # noqa: B017, PT011 - the driver's own disconnect error
            await _pid(engine)
        second = await _pid(engine)
        _terminate(config.connection_url, second)
        # Unused for a minute: checked first, and replaced for the same checkout.
        clock.now += IDLE_PING_SECONDS
        third = await _pid(engine)
        assert third not in (first, second)
        # A live connection passes its check and is kept.
        clock.now += IDLE_PING_SECONDS
        assert await _pid(engine) == third
    finally:
        await engine.dispose()


async def test_a_connection_unused_past_the_limit_is_replaced(backend: str, rdbms: str) -> None:
    config = load_config_text(rdbms + "connxn-max-idle-time-seconds=5\n").database
    assert config.pool_max_idle_seconds == 5
    clock = Clock()
    engine = create_engine(replace(config, pool_size=1, max_overflow=0), clock=clock)
    try:
        first = await _pid(engine)
        clock.now += 5
        assert await _pid(engine) == first
        clock.now += 5.5
        assert await _pid(engine) != first
    finally:
        await engine.dispose()


async def test_held_connections_are_checked_and_replaced_alike(backend: str, rdbms: str) -> None:
    config = load_config_text(rdbms).database
    url = config.connection_url
    clock = Clock()
    held = Held(url, 1, max_idle_seconds=0, clock=clock)
    limited = Held(url, 1, max_idle_seconds=5, clock=clock)
    try:
        first = (await held.run("SELECT pg_backend_pid()", {}))[0][0]
        _terminate(url, first)
        clock.now += IDLE_PING_SECONDS
        second = (await held.run("SELECT pg_backend_pid()", {}))[0][0]
        assert second != first
        clock.now += 1
        assert (await held.run("SELECT pg_backend_pid()", {}))[0][0] == second

        kept = (await limited.run("SELECT pg_backend_pid()", {}))[0][0]
        clock.now += 6
        assert (await limited.run("SELECT pg_backend_pid()", {}))[0][0] != kept
    finally:
        await held.close()
        await limited.close()


async def test_held_connections_past_their_lifetime_are_replaced(backend: str, rdbms: str) -> None:
    """[rdbms] connxn-max-lifetime-seconds, as the pool recycles its own: counted from the
    connection's opening, however busy it has been."""
    url = load_config_text(rdbms).database.connection_url
    clock = Clock()
    held = Held(url, 1, max_lifetime_seconds=5, clock=clock)
    try:
        first = (await held.run("SELECT pg_backend_pid()", {}))[0][0]
        for _ in range(4):
            clock.now += 1
            assert (await held.run("SELECT pg_backend_pid()", {}))[0][0] == first
        clock.now += 1.5
        assert (await held.run("SELECT pg_backend_pid()", {}))[0][0] != first
    finally:
        await held.close()
