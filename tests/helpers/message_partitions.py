"""The job and message tables' partitions in tests on PostgreSQL: a sweeper's retention
service, statements run in one transaction, and the intervals of the taking partitions ended
(tests/test_partitions.py, tests/test_partition_copies.py)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from app.runtime import Runtime
from app.services.retention import RetentionService

HOLD = 0.5  # seconds a due job is held before its move (the sweeper: two rounds)


def retention(rt: Runtime, retention_days: int = 0) -> RetentionService:
    return RetentionService(rt.db, 3600, retention_days, hold_seconds=HOLD)


async def sql(rt: Runtime, statement: str, **params: Any) -> list[Any]:
    async with rt.db.transaction() as tx:
        result = await tx.conn.execute(text(statement), params)
        return list(result.all()) if result.returns_rows else []


async def interval_over(rt: Runtime) -> None:
    """The taking partition's interval ended (opened an interval and a minute ago)."""
    await sql(
        rt,
        "UPDATE job_partition SET opened_at = now() - interval '61 minutes'"
        " WHERE opened_at IS NOT NULL AND closed_at IS NULL",
    )


async def both_intervals_over(rt: Runtime) -> None:
    """The job and the message tables' taking partitions' intervals ended."""
    await interval_over(rt)
    await sql(
        rt,
        "UPDATE message_partition SET opened_at = now() - interval '61 minutes'"
        " WHERE opened_at IS NOT NULL AND closed_at IS NULL",
    )


async def message_state(rt: Runtime, name: str) -> str:
    rows = await sql(rt, "SELECT status FROM message_partition WHERE name = :n", n=name)
    return str(rows[0][0])
