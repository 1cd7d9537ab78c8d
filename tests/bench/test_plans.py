"""The bench's plans (bench/plans.py, issue 37) are of the broker's own statements: the texts
are app/store's, and the claim's report shows the queue walk inside claimable_jobs (the claim
index in order under a Limit), which EXPLAIN of the claim alone hides in a Function Scan. Run
on a migrated throwaway PostgreSQL database; no plan's cost or timing is judged."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest

from app.runtime import Runtime
from app.store import attempts
from app.store.db import libpq_url
from app.store.jobs import PENDING_COUNT_CAP
from app.store.queue import Named, ack_sql, claim_sql
from bench import plans
from tests.helpers.pull import CHANNEL, CHANNEL_TOKEN, consumer_pk, publish_many, setup_channel

BATCH = 5
QUEUED = 40


@pytest.fixture
async def conn(runtime: Runtime) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    url = libpq_url(runtime.config.database.connection_url)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as connection:
        yield connection


async def queue(client: httpx.AsyncClient, rt: Runtime) -> tuple[Named, int]:
    (k1,) = await setup_channel(client, "k1")
    await publish_many(rt, QUEUED)
    named = Named.by_credentials(CHANNEL, rt.tokens.digest(CHANNEL_TOKEN), k1.id, k1.token)
    return named, await consumer_pk(rt, k1.id)


def section(plan: list[str], title_has: str) -> list[str]:
    """The lines of one titled plan in a report's list."""
    starts = [n for n, line in enumerate(plan) if line.startswith("-- ")]
    for n in starts:
        if title_has in plan[n]:
            end = next((m for m in starts if m > n), len(plan))
            return plan[n + 1 : end]
    raise AssertionError(f"no plan titled with {title_has!r} in {plan}")


async def statuses(conn: psycopg.AsyncConnection[Any]) -> dict[str, int]:
    rows = await (await conn.execute("SELECT status, count(*) FROM job GROUP BY status")).fetchall()
    return {str(status): int(n) for status, n in rows}


@pytest.mark.parametrize("backend", ["postgresql"])
async def test_texts_are_the_stores(client: httpx.AsyncClient, runtime: Runtime) -> None:
    named, _ = await queue(client, runtime)
    sql, params = plans.claim_statement(named, BATCH, plans.DEFAULT_ACK_WAIT)
    assert sql == claim_sql("credentials", numbered=False, by_bytes=False, capped=False)
    assert params["limit"] == BATCH and params["channel_token"] != CHANNEL_TOKEN
    sql, params = plans.ack_statement(named, [(1, 1), (2, None)])
    assert sql == ack_sql("credentials", False, attempts.kept(), attempts.ACKED)
    assert (params["ids"], params["attempts"]) == ("{1,2}", "{1,NULL}")


@pytest.mark.parametrize("backend", ["postgresql"])
async def test_claim_plan_shows_the_walk_inside_the_function(
    client: httpx.AsyncClient, runtime: Runtime, conn: psycopg.AsyncConnection[Any]
) -> None:
    named, pk = await queue(client, runtime)
    plan = await plans.claim_plans(conn, named, pk, batch=BATCH)
    statement = section(plan, "claim_sql")
    assert any("Function Scan on claimable_jobs" in line for line in statement), statement
    # The credentials matched: the claim leased a batch (then rolled back).
    assert any(line.lstrip().startswith("Update on job") for line in statement), statement
    walk = section(plan, f"claimable_jobs({pk}, {BATCH})")
    assert walk[0].lstrip().startswith("Limit") and f"rows={BATCH} " in walk[0], walk
    assert any("Index Scan using" in line and "ix_job_claim" in line for line in walk), walk
    assert not any("Sort" in line.split("(")[0] for line in walk), walk
    assert await statuses(conn) == {"QUEUED": QUEUED}


@pytest.mark.parametrize("backend", ["postgresql"])
async def test_pending_count_and_batch_ack_plans(
    client: httpx.AsyncClient, runtime: Runtime, conn: psycopg.AsyncConnection[Any]
) -> None:
    named, pk = await queue(client, runtime)
    pending = await plans.pending_plan(conn, pk, BATCH)
    assert f"due_jobs_ahead({pk}, {PENDING_COUNT_CAP + BATCH})" in pending[0]
    assert any("Limit" in line for line in pending) and any(
        "ix_job_claim" in line for line in pending
    )
    ack = await plans.ack_plan(conn, named, batch=BATCH, inflight=30)
    assert "batch ack of 5" in ack[0] and "30 claimed before it" in ack[0], ack
    assert any(line.lstrip().startswith("Update on job") for line in ack), ack
    assert any(f"rows={BATCH} " in line and "Update on job" in line for line in ack), ack
    assert await statuses(conn) == {"QUEUED": QUEUED}
