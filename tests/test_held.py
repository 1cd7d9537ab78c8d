"""store/db.Held, the connections the push dispatcher keeps to itself for its claims and acks:
each statement runs alone (autocommit), and a failed statement, a connection the server dropped
or a cancelled statement leaves the next one a working connection and its slot."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import psycopg
import pytest

from app.config import load_config_text
from app.domain.errors import Unavailable, UnstorableValue
from app.store.db import Database, Held
from app.store.queue import int_array
from tests.helpers.waiting import eventually


@contextlib.asynccontextmanager
async def held_connections(rdbms: str, size: int) -> AsyncIterator[tuple[Database, Held]]:
    if "dialect=postgresql" not in rdbms:
        pytest.skip("held connections are PostgreSQL's (SQLite has the pool's one)")
    db = Database.from_config(load_config_text(rdbms).database)
    connections = db.held(size)
    assert connections is not None
    try:
        yield db, connections
    finally:
        await connections.close()
        await db.dispose()


@pytest.fixture
async def held(rdbms: str) -> AsyncIterator[tuple[Database, Held]]:
    """One held connection (so a slot not given back would stall the next statement)."""
    async with held_connections(rdbms, 1) as both:
        yield both


async def test_statements_run_alone(held: tuple[Database, Held]) -> None:
    db, connections = held
    assert await connections.run("SELECT %(n)s::int + 1", {"n": 1}) == [(2,)]
    await connections.run("CREATE TABLE held_probe (x integer)", {})
    # Committed at once: another connection sees it.
    assert await db.run_alone("SELECT to_regclass('held_probe') IS NOT NULL", {}) == [(True,)]


async def test_after_a_failed_statement(held: tuple[Database, Held]) -> None:
    _, connections = held
    ((pid,),) = await connections.run("SELECT pg_backend_pid()", {})
    with pytest.raises(psycopg.errors.UndefinedTable):
        await connections.run("SELECT * FROM no_such_table WHERE 1 = %(n)s", {"n": 0})
    with pytest.raises(UnstorableValue):
        await connections.run("SELECT %(n)s::text", {"n": "a\x00b"})  # refused: a NUL
    # The statements failed, not the connection: it is kept (bad input costs no new backend).
    assert await asyncio.wait_for(connections.run("SELECT pg_backend_pid()", {}), 5) == [(pid,)]


async def test_after_the_server_dropped_the_connection(held: tuple[Database, Held]) -> None:
    db, connections = held
    ((pid,),) = await connections.run("SELECT pg_backend_pid()", {})
    # The second argument waits until the backend is gone.
    await db.run_alone("SELECT pg_terminate_backend(%(pid)s, 5000)", {"pid": pid})
    with pytest.raises(Unavailable):
        await connections.run("SELECT 1", {})
    ((other,),) = await asyncio.wait_for(connections.run("SELECT pg_backend_pid()", {}), 5)
    assert other != pid


async def test_a_restarted_server_costs_one_failed_statement(rdbms: str) -> None:
    """When one connection turns out dropped, the others opened before it are replaced at
    their next use instead of failing a statement each (as the pool invalidates its own)."""
    async with held_connections(rdbms, 2) as (db, connections):
        # Two at once take both slots: each holds its own while it connects and runs.
        both = "SELECT pg_backend_pid()"
        pids = {
            rows[0][0]
            for rows in await asyncio.gather(connections.run(both, {}), connections.run(both, {}))
        }
        assert len(pids) == 2  # two connections open
        for pid in pids:
            await db.run_alone("SELECT pg_terminate_backend(%(pid)s, 5000)", {"pid": pid})
        with pytest.raises(Unavailable):
            await connections.run("SELECT 1", {})
        again = await asyncio.gather(connections.run(both, {}), connections.run(both, {}))
        assert not pids & {rows[0][0] for rows in again}


async def test_after_a_cancelled_statement(held: tuple[Database, Held]) -> None:
    db, connections = held
    sleeping = "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(30)'"
    running = asyncio.create_task(connections.run("SELECT pg_sleep(30)", {}))

    async def on_the_server(count: int) -> bool:
        return await db.run_alone(sleeping, {}) == [(count,)]

    await eventually(lambda: on_the_server(1), what="the statement running on the server")
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running
    assert await asyncio.wait_for(connections.run("SELECT 1", {}), 5) == [(1,)]
    # Its connection was closed, so the server stopped the statement rather than finishing it.
    await eventually(lambda: on_the_server(0), 5, 0.1, what="the server stopped the statement")


async def test_closed_connections_run_nothing(held: tuple[Database, Held]) -> None:
    _, connections = held
    assert await connections.run("SELECT 1", {}) == [(1,)]
    await connections.close()
    with pytest.raises(Unavailable):
        await connections.run("SELECT 1", {})


def test_integer_array_literals() -> None:
    assert int_array([1, 2, 30]) == "{1,2,30}"
    assert int_array([7, None, 9]) == "{7,NULL,9}"
    assert int_array([]) == "{}"
