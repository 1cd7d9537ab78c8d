"""`/job-status` and `/dlq-status` (the Go original's), read from the trigger-kept counters:
the counters must equal a count of the rows after every kind of change, concurrent ones too."""

from __future__ import annotations

import asyncio
from datetime import datetime

import httpx
from sqlalchemy import delete, func, select

from app.runtime import Runtime
from app.store.schema import consumer, job, job_count, message
from tests.helpers.pull import (
    CHANNEL,
    consumer_pk,
    publish,
    publish_many,
    pull_jobs,
    setup_channel,
)


async def counted(rt: Runtime) -> dict[tuple[str, str], int]:
    """What the counters say, per (consumer id, status), zeros left out."""
    query = (
        select(consumer.c.consumer_id, job_count.c.status, func.sum(job_count.c.n))
        .join(consumer, consumer.c.pk == job_count.c.consumer_pk)
        .group_by(consumer.c.consumer_id, job_count.c.status)
    )
    async with rt.db.transaction() as tx:
        return {(c, s): int(n) for c, s, n in await tx.conn.execute(query) if n}


async def rows(rt: Runtime) -> dict[tuple[str, str], int]:
    """The same, counted from the job rows."""
    query = (
        select(consumer.c.consumer_id, job.c.status, func.count())
        .join(consumer, consumer.c.pk == job.c.consumer_pk)
        .group_by(consumer.c.consumer_id, job.c.status)
    )
    async with rt.db.transaction() as tx:
        return {(c, s): int(n) for c, s, n in await tx.conn.execute(query)}


async def test_job_status_and_dlq_status_in_the_go_shape(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    k1, k2 = await setup_channel(client, "k1", "k2")
    for n in range(5):
        await publish(client, f"m{n}")
    jobs = await pull_jobs(client, k1, batch=3)
    acks = [{"id": jobs[0]["ID"], "type": "ack"}, {"id": jobs[1]["ID"], "type": "term"}]
    r = await client.post(f"{k1.base}/ack", json={"acks": acks}, headers=k1.auth)
    assert r.status_code == 200, r.text

    r = await client.get("/job-status")
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {CHANNEL}
    by_status = {cid: {e["status"]: e for e in entries} for cid, entries in body[CHANNEL].items()}
    assert {cid: {s: e["count"] for s, e in v.items()} for cid, v in by_status.items()} == {
        "k1": {"QUEUED": 2, "INFLIGHT": 1, "DELIVERED": 1, "DEAD": 1},
        "k2": {"QUEUED": 5},
    }
    queued = by_status["k2"]["QUEUED"]
    assert queued["statusCode"] == 1001  # Go: JobQueued
    oldest = datetime.fromisoformat(queued["oldestItemTimestamp"])
    newest = datetime.fromisoformat(queued["newestItemTimestamp"])
    assert oldest <= newest
    assert by_status["k1"]["INFLIGHT"]["statusCode"] == 1002
    assert by_status["k1"]["DELIVERED"]["statusCode"] == 1003
    assert by_status["k1"]["DEAD"]["statusCode"] == 1004

    r = await client.get("/dlq-status")
    assert r.status_code == 200, r.text
    assert r.json() == {
        "consumers": [
            {
                "channelId": CHANNEL,
                "channelName": CHANNEL,
                "consumerId": "k1",
                "consumerName": "k1",
                "deadCount": 1,
            }
        ]
    }
    assert await counted(runtime) == await rows(runtime)
    status = await client.get(f"/channel/{CHANNEL}/messages-status")
    assert status.json()["Counts"]["QUEUED"] == {"Count": 7}
    assert status.json()["Counts"]["DEAD"] == {"Count": 1}


async def test_the_counters_follow_every_kind_of_change(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    k1, k2, k3 = await setup_channel(client, "k1", "k2", "k3")
    await publish_many(runtime, 60)
    assert await counted(runtime) == await rows(runtime)

    # concurrent batch claims and acks of one consumer (different connections, shards)
    async def worker() -> None:
        while batch := await pull_jobs(client, k1, batch=4, no_wait=True):
            kinds = ["ack" if n % 3 else "term" for n in range(len(batch))]
            acks = [{"id": j["ID"], "type": kind} for j, kind in zip(batch, kinds, strict=True)]
            r = await client.post(f"{k1.base}/ack", json={"acks": acks}, headers=k1.auth)
            assert r.status_code == 200, r.text

    await asyncio.gather(*(worker() for _ in range(6)))
    await pull_jobs(client, k2, batch=10)  # in flight
    assert await counted(runtime) == await rows(runtime)

    purged = await client.delete(f"{k1.base}/dlq", headers=k1.auth)
    assert purged.json()["deletedCount"] > 0
    requeued = await client.post(f"{k1.base}/dlq", headers=k1.auth)
    assert requeued.status_code == 202
    assert await counted(runtime) == await rows(runtime)

    # a message's jobs deleted with it, a consumer deleted (all its jobs cascade)
    k3_pk = await consumer_pk(runtime, "k3")
    async with runtime.db.transaction() as tx:
        gone = delete(message).where(message.c.message_id == "m7").returning(message.c.pk)
        pks = list((await tx.conn.execute(gone)).scalars())
        await tx.conn.execute(delete(job).where(job.c.message_pk.in_(pks)))
    modified = (await client.get(k3.base)).headers["Last-Modified"]
    r = await client.delete(k3.base, headers={"If-Unmodified-Since": modified})
    assert r.status_code in (200, 204), r.text
    after = await counted(runtime)
    assert after == await rows(runtime)
    left = select(func.coalesce(func.sum(job_count.c.n), 0)).where(job_count.c.consumer_pk == k3_pk)
    async with runtime.db.transaction() as tx:
        assert (await tx.conn.execute(left)).scalar_one() == 0
    body = (await client.get("/job-status")).json()
    assert "k3" not in body[CHANNEL]
    assert sum(e["count"] for e in body[CHANNEL]["k2"]) == 59
