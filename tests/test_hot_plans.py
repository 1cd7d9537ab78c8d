"""The hot claim and batch ack settle on PostgreSQL's generic plans once prepared.

A statement PostgreSQL keeps planning anew costs it a third of a millisecond per call (more
than running a small ack). It happens when the generic plan looks dearer than the custom ones,
as it does for LIMIT $n (priced for a tenth of the table), and it does not show in any result,
so it is checked here on the one connection that served every request.
"""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import text

from app.runtime import Runtime
from app.store.jobs import PENDING_COUNT_CAP
from app.store.queue import Named
from tests.helpers.pull import bulk_publish, consumer_pk, setup_channel

ROUNDS = 14  # psycopg prepares on the 6th call; PostgreSQL tries 5 custom plans first
BATCH = 12  # batch acks above ten elements were once left unprepared
QUEUED = 20_000  # a generic LIMIT $n only looks dear on a table the statistics call big


@pytest.fixture
def extra_config(rdbms: str) -> str:
    if "dialect=postgresql" not in rdbms:
        pytest.skip("plans are PostgreSQL's")
    return "max-idle-connxns=1\nmax-open-connxns=1\n"


async def test_claim_and_batch_ack_use_generic_plans(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    (k1,) = await setup_channel(client)
    await bulk_publish(runtime, QUEUED)
    await runtime.db.run_alone("ANALYZE job", {})
    for _ in range(ROUNDS):
        r = await client.post(
            f"{k1.base}/pull", json={"batch": BATCH, "no_wait": True}, headers=k1.auth
        )
        assert r.status_code == 200, r.text
        jobs = r.json()["Jobs"]
        assert len(jobs) == BATCH
        acks = [{"id": j["ID"], "attempt": j["Attempt"]} for j in jobs]
        r = await client.post(f"{k1.base}/ack", json={"acks": acks}, headers=k1.auth)
        assert [o["status"] for o in r.json()["Results"]] == [202] * BATCH, r.text

    rows = await runtime.db.run_alone(
        "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements", {}
    )
    plans = {
        kind: [(generic, custom) for statement, generic, custom in rows if marker in statement]
        for kind, marker in (("claim", "claimable_jobs("), ("ack", "unnest("))
    }
    for kind, found in plans.items():
        assert len(found) == 1, f"the {kind} was not prepared once: {found}"
        generic, custom = found[0]
        assert generic > 0 and custom <= 5, f"the {kind} is planned per call: {found[0]}"


BURST = 20_000  # queued after an ANALYZE that saw none: a sorted claim reads them all


@pytest.mark.parametrize("capped", [False, True], ids=["uncapped", "max-ack-pending"])
async def test_a_claim_walks_the_queue_in_order_after_an_analyze_saw_it_empty(
    client: httpx.AsyncClient, runtime: Runtime, capped: bool
) -> None:
    # With statistics that expect a row or two, the claim statement was planned as a bitmap
    # scan of the whole queue and a sort: 200-400 ms a claim in a burst (migration
    # 0010_claim_functions). Walked in order, a claim reads the entries it takes and the ones
    # it counts as pending (up to the cap), and the update finds the ten by primary key,
    # whatever the queue holds.
    await setup_channel(client)
    # A table of finished jobs and an empty queue when ANALYZE looks, then a burst (the same
    # jobs queued again).
    await bulk_publish(runtime, BURST)
    await runtime.db.run_alone("UPDATE job SET status = 'DELIVERED'", {}, prepare=False)
    await runtime.db.run_alone("ANALYZE job", {}, prepare=False)
    await runtime.db.run_alone("UPDATE job SET status = 'QUEUED'", {}, prepare=False)
    named = Named(await consumer_pk(runtime, "k1"))
    async with runtime.db.transaction() as tx:
        claimed = await runtime.queue.claim(
            named,
            limit=10,
            default_ack_wait=30,
            max_ack_pending=100 if capped else None,  # claimed in the caller's transaction
            tx=tx,
        )
        read = (
            await tx.conn.execute(
                # This transaction's reads of every index of the job table, so far (not yet
                # flushed): a sorted plan through any of them reads the whole queue.
                text(
                    "SELECT sum(pg_stat_get_xact_tuples_returned(indexrelid))"
                    " FROM pg_index WHERE indrelid IN (SELECT relid FROM pg_partition_tree('job'))"
                )
            )
        ).scalar_one()
    assert len(claimed.jobs) == 10
    assert claimed.pending == PENDING_COUNT_CAP
    assert read <= 10 + (PENDING_COUNT_CAP + 10) + 10 + 100, read
