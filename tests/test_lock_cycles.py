"""A request that meets a lock cycle in PostgreSQL runs again; it is not answered 503.

PostgreSQL breaks a lock cycle by rolling back one of its transactions (40P01), found by the
waiting backend whose deadlock_timeout runs out first. A batch of acks of several kinds runs
one statement per kind in one transaction, each locking its jobs; a plain batch runs one
statement that locks its jobs one after another. Another writer locking the same jobs in the
other order closes a cycle. The chaos test (tests/test_pull_concurrency.py)
met one between two workers' batches and got "the database is unavailable" for an ack.

Staged here with an admin connection: it locks one job; the broker's statement locks the
other and waits for the admin's; then the admin asks for the broker's. The broker's backend
began waiting first, so with the admin's deadlock_timeout far longer it is the one that finds
the cycle and rolls back. The admin's lock is then granted, it commits, and the broker's
request, run again, settles every ack.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import httpx
import psycopg
import pytest

from app.runtime import Runtime
from app.store.db import libpq_url
from tests.helpers.pull import PullConsumer, job_row, publish_many, pull_jobs, setup_channel
from tests.helpers.waiting import eventually


@pytest.fixture
def extra_config(rdbms: str) -> str:
    if "dialect=postgresql" not in rdbms:
        pytest.skip("SQLite has one writer at a time: no lock cycles")
    return ""


@pytest.fixture
async def admin(runtime: Runtime) -> AsyncIterator[psycopg.AsyncConnection]:
    url = libpq_url(runtime.config.database.connection_url)
    async with await psycopg.AsyncConnection.connect(url) as conn:
        # Far past the server's default (1 s): the broker's backend is the one that checks.
        await conn.execute("SET deadlock_timeout = '30s'")
        await conn.commit()
        yield conn


async def deadlocks(admin: psycopg.AsyncConnection) -> int:
    cur = await admin.execute(
        "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
    )
    row = await cur.fetchone()
    await admin.commit()
    assert row is not None
    return int(row[0])


async def deadlocks_since(admin: psycopg.AsyncConnection, before: int) -> bool:
    return await deadlocks(admin) > before


async def waiting_for_a_row(admin: psycopg.AsyncConnection) -> bool:
    """Some other backend waits for a row lock (a transaction id, as waits on rows show)."""
    cur = await admin.execute(
        "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'transactionid'"
        " AND pid <> pg_backend_pid()"
    )
    row = await cur.fetchone()
    return row is not None and row[0] > 0


async def lock(admin: psycopg.AsyncConnection, job_id: int) -> None:
    await admin.execute("SELECT id FROM job WHERE id = %s FOR UPDATE", (job_id,))


async def in_flight(client: httpx.AsyncClient, runtime: Runtime, who: PullConsumer) -> list[Any]:
    await publish_many(runtime, 2)
    jobs = await pull_jobs(client, who, batch=2)
    assert len(jobs) == 2
    return sorted(jobs, key=lambda j: int(j["ID"]))


async def staged_cycle(
    admin: psycopg.AsyncConnection,
    first: int,
    second: int,
    send: Callable[[], Coroutine[Any, Any, httpx.Response]],
) -> httpx.Response:
    """The admin holds `first`, then the request is sent; once it waits for `first` (holding
    `second`), the admin asks for `second`, is granted it when the request's transaction
    rolls back, and commits. Returns the request's answer."""
    before = await deadlocks(admin)
    await lock(admin, first)
    request = asyncio.create_task(send())
    await eventually(lambda: waiting_for_a_row(admin), what="the request waiting for the job")
    await lock(admin, second)  # blocks until PostgreSQL rolls the request's transaction back
    await admin.commit()
    response = await request
    # Counted by the rolled-back backend, and reported to the statistics a moment later.
    await eventually(
        lambda: deadlocks_since(admin, before), 15, what="the staged cycle counted as a deadlock"
    )
    return response


# Either way the batch locks `low`, then waits for `high`: a mixed batch in its ACK statement
# and then its NAK statement; a plain one in its one statement (named in that order, and in the
# order of their ids).
@pytest.mark.parametrize("kinds", [("ack", "nak"), ("ack", "ack")], ids=["mixed", "plain"])
async def test_a_batch_of_acks_that_meets_a_lock_cycle_runs_again(
    client: httpx.AsyncClient,
    runtime: Runtime,
    admin: psycopg.AsyncConnection,
    kinds: tuple[str, str],
) -> None:
    (who,) = await setup_channel(client)
    low, high = await in_flight(client, runtime, who)
    jobs = list(zip((low, high), kinds, strict=True))
    acks = [{"id": job["ID"], "attempt": job["Attempt"], "type": kind} for job, kind in jobs]
    response = await staged_cycle(
        admin,
        int(high["ID"]),
        int(low["ID"]),
        lambda: client.post(f"{who.base}/ack", json={"acks": acks}, headers=who.auth),
    )
    assert response.status_code == 200, response.text
    assert [r["status"] for r in response.json()["Results"]] == [202, 202]
    settled = {"ack": "DELIVERED", "nak": "QUEUED"}
    for job, kind in jobs:
        assert (await job_row(runtime, job["ID"])).status == settled[kind]
