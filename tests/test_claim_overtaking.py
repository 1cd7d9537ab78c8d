"""Two claims of one consumer side by side can overtake a job, so an AckNone consumer's claims
never run side by side (app/domain/pull_round.Limits.of).

The race, staged: the claim's walk (claimable_jobs, migration 0010) takes a snapshot newer
than its statement's. The first claim's statement begins; jobs already due commit (a history
chunk's, or a publish's that began earlier); its walk locks the first of them, which its update
cannot see. The second claim's statement begins after that commit, skips those jobs as locked
and takes the ones after them, and the skipped ones come in the next round, after them, under
consecutive delivery sequences. Here the first claim waits on advisory locks the test holds (a
wrapper around the real walk) and the second starts once the first has walked; in production
the same order comes from a commit landing between two statements sent together.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
from sqlalchemy import text

from app.domain.models import Consumer
from app.domain.pulls import ClaimBatch
from app.runtime import Runtime
from app.services.claiming import ClaimSource
from app.services.scheduler import PullScheduler, Waiter
from app.store.db import libpq_url
from tests.helpers.pull import CHANNEL, PRODUCER, consumer_pk, publish_many, setup_channel
from tests.helpers.sinks import Recorder
from tests.helpers.waiting import eventually

MAX_CLAIM = 10
JOBS = 2 * MAX_CLAIM  # the request's batch: a round's claims split in two where allowed
EARLY, LATE = 5, 20  # jobs published before the first claim, and while it waits to walk

# The late jobs, committed while the first claim waits to walk, and due before its statement
# began: as a history chunk's jobs are (due at their transaction's start) or a publish's that
# began before the claim and committed during it.
LATE_JOBS = """
WITH late AS (
    INSERT INTO message (channel_id, message_id, producer_id, payload, content_type, priority,
                         headers, received_at)
    SELECT %(channel)s, 'late' || g, %(producer)s, convert_to('late-' || g, 'UTF8'),
           'text/plain', 0, '{}'::json, now() - interval '1 minute'
    FROM generate_series(1, %(n)s) AS g ORDER BY g
    RETURNING pk
)
INSERT INTO job (message_pk, consumer_pk, status, priority, payload_size,
                 earliest_next_attempt_at, status_changed_at, created_at)
SELECT late.pk, %(consumer)s, 'QUEUED', 0, 6, now() - interval '1 minute', now(), now()
FROM late ORDER BY late.pk
"""
WALK_STARTS, WALK_ENDS = 7001, 7002  # advisory locks the first claim waits on

# The real walk renamed, and in its place a wrapper: the first claim running (the one that
# takes the transaction-level lock 7000) waits for the test before and after the walk.
STAGED_WALK = f"""
ALTER FUNCTION claimable_jobs(bigint, integer) RENAME TO claimable_jobs_walk;
CREATE FUNCTION claimable_jobs(of_consumer bigint, up_to integer)
RETURNS TABLE (id bigint, priority integer, payload_size integer)
LANGUAGE plpgsql VOLATILE ROWS 100 AS $$
DECLARE
    first boolean := pg_try_advisory_xact_lock(7000);
BEGIN
    IF first THEN PERFORM pg_advisory_xact_lock_shared({WALK_STARTS}); END IF;
    RETURN QUERY SELECT * FROM claimable_jobs_walk(of_consumer, up_to);
    IF first THEN PERFORM pg_advisory_xact_lock_shared({WALK_ENDS}); END IF;
END
$$;
"""


@pytest.fixture
def extra_config(rdbms: str) -> str:
    if "dialect=postgresql" not in rdbms:
        pytest.skip("the walk's own snapshot is PostgreSQL's (SQLite claims in one transaction)")
    return "max-idle-connxns=8\nmax-open-connxns=8\n"  # claims side by side need two


class SecondWaits(ClaimSource):
    """The real claims; one that starts while another runs waits for `go` first."""

    def __init__(self, runtime: Runtime) -> None:
        super().__init__(runtime.db, runtime.queue, runtime.claims.default_ack_wait)
        self.running = 0
        self.held = 0
        self.finished = 0
        self.go = asyncio.Event()

    async def claim(self, consumer: Consumer, limit: int, **terms: Any) -> ClaimBatch:
        if self.running:
            self.held += 1
            await self.go.wait()
        self.running += 1
        try:
            return await super().claim(consumer, limit, **terms)
        finally:
            self.running -= 1
            self.finished += 1


@pytest.fixture
async def admin(runtime: Runtime) -> AsyncIterator[psycopg.AsyncConnection]:
    url = libpq_url(runtime.config.database.connection_url)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        yield conn


async def waiting_on(admin: psycopg.AsyncConnection, lock: int) -> bool:
    cur = await admin.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s AND NOT granted",
        (lock,),
    )
    row = await cur.fetchone()
    return row is not None and row[0] > 0


async def staged_round(
    client: httpx.AsyncClient,
    runtime: Runtime,
    admin: psycopg.AsyncConnection,
    ack_policy: str,
) -> tuple[list[tuple[int, int]], int]:
    """The race staged under one waiting request for JOBS: what it got, in the order handed
    out, and how many claims started while another ran."""
    await setup_channel(client)
    pk = await consumer_pk(runtime, "k1")
    async with runtime.db.transaction() as tx:
        await tx.conn.execute(
            text("UPDATE consumer SET ack_policy = :policy WHERE pk = :pk"),
            {"policy": ack_policy, "pk": pk},
        )
    consumer = await runtime.admin.get_consumer(CHANNEL, "k1")
    assert consumer.options.ack_policy == ack_policy
    # One at a time, so that job ids follow publish order (concurrent publishes need not).
    await publish_many(runtime, EARLY, concurrency=1, prefix="early")
    await admin.execute(STAGED_WALK)
    await admin.execute(
        "SELECT pg_advisory_lock(%s), pg_advisory_lock(%s)", (WALK_STARTS, WALK_ENDS)
    )

    claims = SecondWaits(runtime)
    scheduler = PullScheduler(claims, runtime.signals, max_claim=MAX_CLAIM, max_waiting=10)
    sink = Recorder(numbered=True)
    try:
        scheduler.submit(consumer, Waiter(sink, batch_left=JOBS))
        # The first claim's statement has begun (its snapshot taken) and waits to walk.
        await eventually(lambda: waiting_on(admin, WALK_STARTS), what="the first claim waiting")
        late = {"channel": CHANNEL, "producer": PRODUCER, "n": LATE, "consumer": pk}
        await admin.execute(LATE_JOBS, late)
        await admin.execute("SELECT pg_advisory_unlock(%s)", (WALK_STARTS,))
        # It has locked the early jobs and the first late ones, which its update cannot see.
        await eventually(lambda: waiting_on(admin, WALK_ENDS), what="the first claim's walk")
        # A second claim, if the round made one (it started beside the first and waits), runs
        # now, and is done before the first can end.
        claims.go.set()
        await eventually(lambda: claims.finished == claims.held, what="the second claim")
        await admin.execute("SELECT pg_advisory_unlock(%s)", (WALK_ENDS,))
        scheduler.wake(pk)  # the late jobs' publish would have (LATE_JOBS notifies nobody)
        await eventually(lambda: len(sink.deliveries) >= JOBS, what="every job handed out")
    finally:
        await scheduler.close()
    return [(d.job.id, d.seq) for d in sink.deliveries], claims.held


async def test_side_by_side_claims_overtake_a_job_committed_during_the_first(
    client: httpx.AsyncClient, runtime: Runtime, admin: psycopg.AsyncConnection
) -> None:
    got, held = await staged_round(client, runtime, admin, "explicit")
    assert held == 1
    ids = [job_id for job_id, _ in got]
    early, late = sorted(ids)[:EARLY], sorted(ids)[EARLY:]
    # The first claim got the early jobs; the second skipped the late ones the first had
    # locked and took the ten after them; those five came in the next round. The sequences
    # run on without a gap, so a client cannot tell.
    skipped = MAX_CLAIM - EARLY
    assert ids == early + late[skipped : skipped + MAX_CLAIM] + late[:skipped]
    assert [seq for _, seq in got] == list(range(1, JOBS + 1))


async def test_an_ack_none_consumer_gets_its_jobs_in_order_through_the_same_race(
    client: httpx.AsyncClient, runtime: Runtime, admin: psycopg.AsyncConnection
) -> None:
    got, held = await staged_round(client, runtime, admin, "none")
    ids = [job_id for job_id, _ in got]
    assert ids == sorted(ids) and len(ids) == JOBS
    assert [seq for _, seq in got] == list(range(1, JOBS + 1))
    assert held == 0  # its claims ran one after the other
