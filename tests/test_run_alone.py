"""Database.run_alone (the hot paths' one-statement autocommit) never hands the pool back a
connection that would run later transactions statement by statement; on PostgreSQL it runs on
connections of its own when one is free, within [rdbms] max-open-connxns."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import psycopg
import pytest
from sqlalchemy import text

from app.config import load_config_text
from app.store.db import MAX_ALONE, Database, alone_share, libpq_url
from tests.helpers.waiting import eventually


@contextlib.asynccontextmanager
async def postgres(rdbms: str, idle: int, most: int) -> AsyncIterator[Database]:
    """PostgreSQL with [rdbms] max-idle-connxns `idle` and max-open-connxns `most`."""
    if "dialect=postgresql" not in rdbms:
        pytest.skip("run_alone's own connections and its pool checks are PostgreSQL's")
    config = load_config_text(rdbms + f"max-idle-connxns={idle}\nmax-open-connxns={most}\n")
    db = Database.from_config(config.database)
    try:
        yield db
    finally:
        await db.dispose()


@pytest.fixture
async def one_connection(rdbms: str) -> AsyncIterator[Database]:
    """A pool of one connection, so every use gets the same one back (and none of its own)."""
    async with postgres(rdbms, 1, 1) as db:
        yield db


async def a_failed_transaction_left_nothing(db: Database) -> bool:
    with contextlib.suppress(RuntimeError):
        async with db.transaction() as tx:
            await tx.conn.execute(text("CREATE TABLE probe (x integer)"))
            raise RuntimeError("roll it back")
    async with db.transaction() as tx:
        return (await tx.conn.execute(text("SELECT to_regclass('probe')"))).scalar() is None


async def test_statements_run_alone_and_transactions_stay_transactions(
    one_connection: Database,
) -> None:
    assert await one_connection.run_alone("SELECT %(n)s::int + 1", {"n": 1}) == [(2,)]
    assert await a_failed_transaction_left_nothing(one_connection)


async def test_after_a_failed_statement(one_connection: Database) -> None:
    with pytest.raises(psycopg.errors.UndefinedTable):
        await one_connection.run_alone("SELECT * FROM no_such_table WHERE 1 = %(n)s", {"n": 0})
    assert await a_failed_transaction_left_nothing(one_connection)


async def test_after_a_cancelled_statement(one_connection: Database) -> None:
    running = asyncio.create_task(one_connection.run_alone("SELECT pg_sleep(5)", {}))
    await asyncio.sleep(0.3)
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running
    assert await a_failed_transaction_left_nothing(one_connection)


@pytest.mark.parametrize(
    ("pool_size", "max_overflow", "alone", "pool"),
    [
        (10, 10, 4, 6),  # the defaults: max-idle-connxns 10, max-open-connxns 20
        (20, 0, 4, 16),  # never more than MAX_ALONE
        (3, 0, 1, 2),  # at most half of the connections open at once
        (2, 0, 1, 1),
        (1, 19, 0, 1),  # never the pool's last one
        (1, 0, 0, 1),
    ],
)
def test_alone_share(pool_size: int, max_overflow: int, alone: int, pool: int) -> None:
    assert alone_share(pool_size, max_overflow) == (alone, pool)
    # Kept open, and open at once, as many as before.
    assert alone + pool == pool_size
    assert alone <= MAX_ALONE


@pytest.fixture
async def shared(rdbms: str) -> AsyncIterator[Database]:
    """max-idle-connxns 2 and max-open-connxns 3: one connection run_alone's own, a pool of one
    and one overflow."""
    async with postgres(rdbms, 2, 3) as db:
        yield db


async def test_run_alone_has_connections_of_its_own_within_max_open(
    shared: Database, rdbms: str
) -> None:
    alone = (await shared.run_alone("SELECT pg_backend_pid()", {}))[0][0]
    async with shared.transaction() as tx:
        pooled = (await tx.conn.execute(text("SELECT pg_backend_pid()"))).scalar()
    assert pooled != alone
    assert (await shared.run_alone("SELECT pg_backend_pid()", {}))[0][0] == alone

    # Four statements at once, each held on a lock the test keeps: three connections run
    # them (its own, the pool's and the overflow) and the fourth waits for the pool.
    url = libpq_url(load_config_text(rdbms).database.connection_url)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as keeper:
        await keeper.execute("SELECT pg_advisory_lock(4040)")
        blocked = "SELECT pg_backend_pid() FROM (SELECT pg_advisory_lock_shared(4040)) AS held"
        running = [asyncio.create_task(shared.run_alone(blocked, {})) for _ in range(4)]

        async def waiting_on_the_lock() -> int:
            cursor = await keeper.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            )
            row = await cursor.fetchone()
            assert row is not None and row[0] == 3, row
            return int(row[0])

        await eventually(waiting_on_the_lock)
        assert not any(task.done() for task in running)
        await keeper.execute("SELECT pg_advisory_unlock(4040)")
        pids = {rows[0][0] for rows in await asyncio.gather(*running)}
    assert alone in pids and len(pids) <= 3


async def test_a_cancelled_statement_on_its_own_connection(shared: Database) -> None:
    """Cancelled, the statement stops on the server (its connection is closed) and the next
    one runs."""
    sleeping = "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(30)'"
    ((alone,),) = await shared.run_alone("SELECT pg_backend_pid()", {})
    running = asyncio.create_task(shared.run_alone("SELECT pg_sleep(30)", {}))

    async def on_the_server(count: int) -> bool:
        async with shared.transaction() as tx:
            return (await tx.conn.execute(text(sleeping))).scalar() == count

    await eventually(lambda: on_the_server(1), what="the statement running on the server")
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running
    await eventually(lambda: on_the_server(0), 5, 0.1, what="the server stopped the statement")
    ((after,),) = await asyncio.wait_for(shared.run_alone("SELECT pg_backend_pid()", {}), 5)
    assert after != alone  # a new connection of its own
    assert await a_failed_transaction_left_nothing(shared)
