"""Database.run_alone (the hot paths' one-statement autocommit) never hands the pool back a
connection that would run later transactions statement by statement."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import psycopg
import pytest
from sqlalchemy import text

from app.config import load_config_text
from app.store.db import Database


@pytest.fixture
async def one_connection(rdbms: str) -> AsyncIterator[Database]:
    """PostgreSQL with a pool of one connection, so every use gets the same one back."""
    if "dialect=postgresql" not in rdbms:
        pytest.skip("run_alone is for PostgreSQL's hot paths")
    config = load_config_text(rdbms + "max-idle-connxns=1\nmax-open-connxns=1\n")
    db = Database.from_config(config.database)
    try:
        yield db
    finally:
        await db.dispose()


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
