"""The delivery ledger on `/metrics`: published x fan-out = removed on purpose + the jobs held,
per consumer, through every way a job leaves; a job lost or made twice shows; and consumers
created while publishes run are owed exactly the jobs those publishes made for them."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import delete, func, insert, select

from app.cli import main
from app.runtime import Runtime
from app.store.schema import consumer, job
from tests.helpers.metrics import ledger
from tests.helpers.pull import (
    CHANNEL,
    consumer_pk,
    producer_headers,
    publish,
    pull_jobs,
    put_consumer,
    setup_channel,
)
from tests.helpers.waiting import eventually


async def test_the_ledger_adds_up_through_every_removal(
    client: httpx.AsyncClient,
    runtime: Runtime,
    rdbms: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    k1, _k2 = await setup_channel(client, "k1", "k2")
    for n in range(5):
        await publish(client, f"m{n}")
    assert await ledger(client, runtime) == {"k1": (5, 0, 0), "k2": (5, 0, 0)}

    # Two dead letters of k1: one deleted, the other purged.
    jobs = await pull_jobs(client, k1, batch=3)
    for dead in jobs[:2]:
        r = await client.post(k1.job(dead["ID"]) + "/ack", json={"type": "term"}, headers=k1.auth)
        assert r.status_code == 202, r.text
    assert (await client.delete(k1.job(jobs[0]["ID"]), headers=k1.auth)).status_code == 204
    purged = await client.delete(f"{k1.base}/dlq", headers=k1.auth)
    assert purged.json() == {"deletedCount": 1}
    # A scheduled message, cancelled: one job of each consumer removed.
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    r = await client.post(
        f"/channel/{CHANNEL}/broadcast",
        content=b"later",
        headers=producer_headers(
            **{"X-Broker-Message-ID": "later", "X-Broker-Scheduled-For": later}
        ),
    )
    assert r.status_code == 201, r.text
    assert await ledger(client, runtime) == {"k1": (6, 2, 0), "k2": (6, 0, 0)}
    cancelled = await client.delete(
        f"/channel/{CHANNEL}/scheduled-message/later", headers=producer_headers()
    )
    assert cancelled.status_code == 204, cancelled.text
    # A consumer made now is owed only what is published from now on.
    await put_consumer(client, "k3")
    await publish(client, "after")
    assert await ledger(client, runtime) == {"k1": (7, 3, 0), "k2": (7, 1, 0), "k3": (1, 0, 0)}

    # A job lost (deleted behind the broker's back) and one made twice both show.
    k2_pk, k3_pk = await consumer_pk(runtime, "k2"), await consumer_pk(runtime, "k3")
    async with runtime.db.transaction() as tx:
        lost = (
            await tx.conn.execute(select(func.min(job.c.id)).where(job.c.consumer_pk == k2_pk))
        ).scalar_one()
        await tx.conn.execute(delete(job).where(job.c.id == lost))
        twin = (await tx.conn.execute(select(job).where(job.c.consumer_pk == k3_pk))).one()
        await tx.conn.execute(insert(job).values({**twin._asdict(), "id": twin.id + 1000}))
    assert await ledger(client, runtime) == {"k1": (7, 3, 0), "k2": (7, 1, 1), "k3": (1, 0, -1)}

    # Looked into, each is settled from the command line: what it holds becomes its opening
    # balance, and it adds up again from there on.
    config = tmp_path / "broker.cfg"
    config.write_text(rdbms)

    async def cli(*args: str) -> tuple[int, str, str]:
        code = await asyncio.to_thread(main, ["--config", str(config), "ledger", *args])
        out, err = capsys.readouterr()
        return code, out, err

    code, out, _ = await cli()
    assert code == 0
    assert f"{CHANNEL}\tk2\t7\t1\t5\t1" in out.splitlines(), out
    assert f"{CHANNEL}\tk3\t1\t0\t2\t-1" in out.splitlines(), out
    for name, before in (("k2", 1), ("k3", -1)):
        code, out, _ = await cli("--settle", CHANNEL, name)
        assert code == 0 and f"{before} unaccounted before" in out, out
    assert await ledger(client, runtime) == {"k1": (7, 3, 0), "k2": (6, 1, 0), "k3": (2, 0, 0)}
    await publish(client, "settled")
    assert await ledger(client, runtime) == {"k1": (8, 3, 0), "k2": (7, 1, 0), "k3": (3, 0, 0)}
    code, _, err = await cli("--settle", CHANNEL, "nobody")
    assert code == 1 and "no consumer nobody" in err, err


async def test_consumers_made_while_publishing_are_owed_exactly_their_jobs(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    """A publish in flight while a consumer is created either made its job or is not counted
    for it; never counted without the job (the race migration 0008's generations settle)."""
    await setup_channel(client, "k0")
    stop = asyncio.Event()
    published = 0

    async def publisher(n: int) -> None:
        nonlocal published
        while not stop.is_set():
            await publish(client, f"p{n}-{published}", message_id=f"p{n}-{published}")
            published += 1

    publishers = [asyncio.create_task(publisher(n)) for n in range(6)]
    try:
        for n in range(1, 16):
            await put_consumer(client, f"k{n}")
            # Publishes land between consumer creations, so every creation races some.
            before = published
            await eventually(lambda: published > before, what="a publish after the creation")  # noqa: B023
    finally:
        stop.set()
        await asyncio.gather(*publishers)
    entries = await ledger(client, runtime)
    assert len(entries) == 16 and published > 16
    async with runtime.db.transaction() as tx:
        rows = await tx.conn.execute(
            select(consumer.c.consumer_id, func.count(job.c.id))
            .join(job, job.c.consumer_pk == consumer.c.pk, isouter=True)
            .group_by(consumer.c.consumer_id)
        )
        held = {who: n for who, n in rows}
    assert {who: (p, r, u) for who, (p, r, u) in entries.items()} == {
        who: (held[who], 0, 0) for who in held
    }
    assert entries["k0"][0] == published
