"""The seed spec's job-state route against the spec and the Go original: IncrementalTimeout
kept with the job, a lost race a 400, and a consumer's limits held on NextState INFLIGHT."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from app.domain.jobs import JobStatus
from app.runtime import Runtime
from app.store.jobs import JobStore
from tests.helpers.pull import (
    PullConsumer,
    consumer_pk,
    job_row,
    publish,
    set_state,
    setup_channel,
)
from tests.helpers.waiting import eventually

Q, IN, DL, DD = "QUEUED", "INFLIGHT", "DELIVERED", "DEAD"
DEFAULT_LEASE = 32  # connection-timeout-in-seconds (30) + rational-delay-in-seconds (2)


async def queued_job(client: httpx.AsyncClient, who: PullConsumer) -> str:
    message_id = await publish(client, "work")
    r = await client.get(f"{who.base}/queued-jobs?limit=100", headers=who.auth)
    found = [j["ID"] for j in r.json()["Result"] if j["Message"]["MessageID"] == message_id]
    assert len(found) == 1
    return str(found[0])


def lease_from(row: Any, moment: datetime) -> float:
    return float((row.lease_expires_at - moment).total_seconds())


async def test_progress_extends_by_the_jobs_own_incremental_timeout(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    [k1] = await setup_channel(client, "k1")
    job_id = await queued_job(client, k1)
    r = await set_state(client, k1, job_id, {"NextState": IN, "IncrementalTimeout": 600})
    assert r.status_code == 202, r.text
    r = await client.post(f"{k1.job(job_id)}/ack", json={"type": "progress"}, headers=k1.auth)
    assert r.status_code == 200, r.text
    row = await job_row(runtime, job_id)
    # now + ack wait + IncrementalTimeout, not now + ack wait (which was about 32 s).
    assert lease_from(row, row.status_changed_at) > 600
    assert row.incremental_timeout == 600


async def test_dead_to_inflight_without_a_timeout_keeps_the_stored_one(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    [k1] = await setup_channel(client, "k1")
    job_id = await queued_job(client, k1)
    for body in ({"NextState": IN, "IncrementalTimeout": 10}, {"NextState": DD}):
        assert (await set_state(client, k1, job_id, body)).status_code == 202
    assert (await set_state(client, k1, job_id, {"NextState": IN})).status_code == 202
    row = await job_row(runtime, job_id)
    assert (row.status, row.incremental_timeout) == (IN, 10)
    assert lease_from(row, row.claimed_at) == pytest.approx(DEFAULT_LEASE + 10, abs=0.01)


async def test_a_lost_race_is_a_400_saying_another_worker_moved_the_job(
    client: httpx.AsyncClient, runtime: Runtime, backend: str
) -> None:
    if backend != "postgresql":
        pytest.skip("the race is staged with a row lock, which SQLite does not have")
    [k1] = await setup_channel(client, "k1")
    job_id = await queued_job(client, k1)
    assert (await set_state(client, k1, job_id, {"NextState": IN})).status_code == 202
    pk = await consumer_pk(runtime, "k1")
    async with runtime.db.transaction() as tx:
        # Another worker holds the job: our DELIVERED reads it INFLIGHT, then waits on it.
        await tx.conn.execute(
            text("SELECT id FROM job WHERE id = :id FOR UPDATE"), {"id": int(job_id)}
        )
        moving = asyncio.create_task(set_state(client, k1, job_id, {"NextState": DL}))

        async def waits_on_the_lock() -> bool:
            async with runtime.db.transaction() as probe:
                waiting = (
                    await probe.conn.execute(
                        text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
                    )
                ).scalar_one()
            return bool(waiting) or moving.done()

        await eventually(waits_on_the_lock, interval=0.02, what="the DELIVERED waiting on the lock")
        await JobStore(tx).complete(pk, [(int(job_id), None)], JobStatus.DEAD, "other worker")
    r = await moving
    assert r.status_code == 400, r.text
    assert "another worker" in r.json()["detail"]


async def test_inflight_holds_max_ack_pending(client: httpx.AsyncClient) -> None:
    [k1] = await setup_channel(client, "k1", maxAckPending="1")
    first, second = [await queued_job(client, k1) for _ in range(2)]
    assert (await set_state(client, k1, first, {"NextState": IN})).status_code == 202
    r = await set_state(client, k1, second, {"NextState": IN})
    assert r.status_code == 409, r.text
    assert "MaxAckPending of 1" in r.json()["detail"]
    assert (await set_state(client, k1, first, {"NextState": DL})).status_code == 202
    assert (await set_state(client, k1, second, {"NextState": IN})).status_code == 202


async def test_inflight_is_refused_on_a_consumer_with_a_priority_policy(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    [k1] = await setup_channel(client, "k1", priorityGroups="jobs", priorityPolicy="pinned_client")
    job_id = await queued_job(client, k1)
    r = await set_state(client, k1, job_id, {"NextState": IN})
    assert r.status_code == 409, r.text
    assert "pinned_client" in r.json()["detail"]
    assert (await job_row(runtime, job_id)).status == Q
