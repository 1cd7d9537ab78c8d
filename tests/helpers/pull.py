"""Shared set-up for the pull tests: a channel, a producer, pull consumers, and publishing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpx
from sqlalchemy import func, select, text, update

from app.runtime import Runtime
from app.services.publishing import Broadcast
from app.store.db import now, plus_seconds
from app.store.schema import consumer, job
from tests.helpers.waiting import eventually

CHANNEL = "c1"
CHANNEL_TOKEN = "channel-token"
PRODUCER = "p1"
PRODUCER_TOKEN = "producer-token"


@dataclass(frozen=True)
class PullConsumer:
    """One pull consumer of CHANNEL and the paths and headers a worker of it uses."""

    id: str
    token: str

    @property
    def auth(self) -> dict[str, str]:
        return {"X-Broker-Channel-Token": CHANNEL_TOKEN, "X-Broker-Consumer-Token": self.token}

    @property
    def base(self) -> str:
        return f"/channel/{CHANNEL}/consumer/{self.id}"

    def job(self, job_id: object) -> str:
        return f"{self.base}/job/{job_id}"


async def put_consumer(client: httpx.AsyncClient, consumer_id: str, **fields: str) -> PullConsumer:
    form = {"token": f"{consumer_id}-token", "type": "pull", **fields}
    r = await client.put(f"/channel/{CHANNEL}/consumer/{consumer_id}", data=form)
    assert r.status_code == 200, r.text
    return PullConsumer(consumer_id, form["token"])


async def update_consumer(
    client: httpx.AsyncClient, who: PullConsumer, **fields: str
) -> httpx.Response:
    """PUT new fields on an existing consumer (updates need If-Unmodified-Since)."""
    r = await client.get(who.base)
    assert r.status_code == 200, r.text
    form = {"token": who.token, "type": "pull", **fields}
    headers = {"If-Unmodified-Since": r.headers["Last-Modified"]}
    return await client.put(who.base, data=form, headers=headers)


async def setup_channel(
    client: httpx.AsyncClient, *consumer_ids: str, **fields: str
) -> list[PullConsumer]:
    """A channel, a producer and pull consumers (default: one named k1)."""
    r = await client.put(f"/channel/{CHANNEL}", data={"token": CHANNEL_TOKEN})
    assert r.status_code == 200, r.text
    r = await client.put(f"/producer/{PRODUCER}", data={"token": PRODUCER_TOKEN})
    assert r.status_code == 200, r.text
    return [await put_consumer(client, cid, **fields) for cid in consumer_ids or ("k1",)]


def producer_headers(**extra: str) -> dict[str, str]:
    return {
        "X-Broker-Channel-Token": CHANNEL_TOKEN,
        "X-Broker-Producer-ID": PRODUCER,
        "X-Broker-Producer-Token": PRODUCER_TOKEN,
        "Content-Type": "text/plain",
        **extra,
    }


async def publish(
    client: httpx.AsyncClient,
    payload: str | bytes = "hello",
    *,
    priority: int | None = None,
    message_id: str | None = None,
    headers: dict[str, str] | None = None,
) -> str:
    """Broadcast one message over HTTP; returns its message id."""
    extra = dict(headers or {})
    if priority is not None:
        extra["X-Broker-Message-Priority"] = str(priority)
    if message_id is not None:
        extra["X-Broker-Message-ID"] = message_id
    body = payload.encode() if isinstance(payload, str) else payload
    r = await client.post(
        f"/channel/{CHANNEL}/broadcast", content=body, headers=producer_headers(**extra)
    )
    assert r.status_code == 201, r.text
    return r.headers["Location"].rsplit("/", 1)[1]


async def publish_many(rt: Runtime, count: int, *, concurrency: int = 8, prefix: str = "m") -> None:
    """Publish `count` messages through the publishing service (one transaction each)."""
    numbers = iter(range(count))

    async def worker() -> None:
        for n in numbers:
            await rt.publishing.publish(
                CHANNEL,
                Broadcast(
                    # Services take tokens as stored (the API digests what it is sent).
                    channel_token=rt.tokens.digest(CHANNEL_TOKEN),
                    producer_id=PRODUCER,
                    producer_token=rt.tokens.digest(PRODUCER_TOKEN),
                    payload=f"payload {n}".encode(),
                    content_type="text/plain",
                    priority=None,
                    message_id=f"{prefix}{n}",
                    metadata_header_names=None,
                    headers={},
                ),
            )

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def bulk_publish(
    rt: Runtime, count: int, *, channel: str = CHANNEL, producer: str = PRODUCER
) -> None:
    """`count` messages and their jobs in two statements (PostgreSQL), then the NOTIFY a
    publish would send."""
    async with rt.db.transaction() as tx:
        await tx.conn.execute(
            text(
                "INSERT INTO message (channel_id, message_id, producer_id, payload, content_type,"
                " priority, headers, received_at)"
                " SELECT :channel, 'd' || g, :producer, convert_to('job-' || g, 'UTF8'),"
                " 'text/plain', 0, '{}'::json, now() FROM generate_series(1, :n) AS g"
            ),
            {"channel": channel, "producer": producer, "n": count},
        )
        pks = (
            await tx.conn.execute(
                text(
                    "INSERT INTO job (message_pk, consumer_pk, status, priority, payload_size,"
                    " earliest_next_attempt_at, status_changed_at, created_at)"
                    " SELECT m.pk, c.pk, 'QUEUED', 0, length(m.payload), now(), now(), now()"
                    " FROM message m JOIN consumer c ON c.channel_id = m.channel_id"
                    " WHERE m.channel_id = :channel RETURNING consumer_pk"
                ),
                {"channel": channel},
            )
        ).scalars()
        tx.announce(set(pks))


async def job_rows(rt: Runtime, consumer_id: str | None = None) -> list[Any]:
    """Every job row (optionally of one consumer), oldest first, read straight from the table."""
    query = select(job, consumer.c.consumer_id).join(consumer, consumer.c.pk == job.c.consumer_pk)
    if consumer_id is not None:
        query = query.where(consumer.c.consumer_id == consumer_id)
    async with rt.db.transaction() as tx:
        return list((await tx.conn.execute(query.order_by(job.c.id))).all())


async def job_row(rt: Runtime, job_id: int | str) -> Any:
    async with rt.db.transaction() as tx:
        return (await tx.conn.execute(select(job).where(job.c.id == int(job_id)))).one()


async def status_counts(rt: Runtime) -> dict[str, int]:
    async with rt.db.transaction() as tx:
        rows = await tx.conn.execute(select(job.c.status, func.count()).group_by(job.c.status))
        return {status: int(n) for status, n in rows}


async def expire_leases(rt: Runtime, job_ids: Iterable[int | str], seconds_ago: float = 5) -> None:
    """Move the leases of in-flight jobs into the past, as if their ack wait had run out."""
    ids = [int(i) for i in job_ids]
    dialect = rt.db.dialect
    async with rt.db.transaction() as tx:
        past = plus_seconds(dialect, now(dialect), -seconds_ago)
        await tx.conn.execute(update(job).where(job.c.id.in_(ids)).values(lease_expires_at=past))


async def make_due(rt: Runtime, job_ids: Iterable[int | str]) -> None:
    """Make queued jobs due now, as if their backoff had passed."""
    ids = [int(i) for i in job_ids]
    dialect = rt.db.dialect
    async with rt.db.transaction() as tx:
        await tx.conn.execute(
            update(job).where(job.c.id.in_(ids)).values(earliest_next_attempt_at=now(dialect))
        )


async def pull(client: httpx.AsyncClient, who: PullConsumer, **body: Any) -> httpx.Response:
    return await client.post(f"{who.base}/pull", json=body, headers=who.auth)


async def pull_jobs(client: httpx.AsyncClient, who: PullConsumer, **body: Any) -> list[Any]:
    body.setdefault("no_wait", True)
    r = await pull(client, who, **body)
    assert r.status_code == 200, r.text
    jobs: list[Any] = r.json()["Jobs"]
    return jobs


async def set_state(
    client: httpx.AsyncClient, who: PullConsumer, job_id: object, body: Any
) -> httpx.Response:
    return await client.post(who.job(job_id), json=body, headers=who.auth)


async def job_status(client: httpx.AsyncClient, who: PullConsumer, job_id: object) -> str:
    r = await client.get(who.job(job_id), headers=who.auth)
    assert r.status_code == 200, r.text
    status: str = r.json()["Status"]
    return status


async def consumer_pk(rt: Runtime, consumer_id: str) -> int:
    async with rt.db.transaction() as tx:
        query = select(consumer.c.pk).where(
            consumer.c.channel_id == CHANNEL, consumer.c.consumer_id == consumer_id
        )
        return int((await tx.conn.execute(query)).scalar_one())


async def until_waiting(rt: Runtime, pk: int, count: int = 1, within: float = 10.0) -> None:
    """Let the event loop run until `count` requests wait on the consumer's queue."""
    await eventually(
        lambda: rt.scheduler.waiting(pk) >= count, within, 0.005, what=f"{count} waiting pulls"
    )
