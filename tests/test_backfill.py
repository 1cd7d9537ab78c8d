"""A consumer's history copied chunk by chunk (app/services/backfill.py), on SQLite and
PostgreSQL: jobs in message order, none twice, publishes during the copy left to it, live
afterwards, a process with a stale cursor copying nothing, the delivery ledger balanced; and
on PostgreSQL a publish that races the switch to live made up for, from the switch's record."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import select

from app.runtime import Runtime
from app.services.backfill import BackfillService, finish
from app.store.backfill import BackfillStore
from app.store.schema import consumer, message
from tests.helpers.metrics import ledger
from tests.helpers.pull import CHANNEL, consumer_pk, job_rows, publish, put_consumer, setup_channel
from tests.helpers.waiting import eventually


async def message_pks(rt: Runtime) -> list[int]:
    async with rt.db.transaction() as tx:
        return list((await tx.conn.execute(select(message.c.pk).order_by(message.c.pk))).scalars())


async def cursor(rt: Runtime, pk: int) -> int | None:
    async with rt.db.transaction() as tx:
        query = select(consumer.c.backfill_next).where(consumer.c.pk == pk)
        value: int | None = (await tx.conn.execute(query)).scalar_one()
        return value


async def copying(client: httpx.AsyncClient, runtime: Runtime, name: str) -> int:
    """A consumer made after the channel's messages (none of their jobs), then set to copy the
    channel from its start, as one made over NATS with deliver policy all is."""
    await put_consumer(client, name)
    pk = await consumer_pk(runtime, name)
    async with runtime.db.transaction() as tx:
        await BackfillStore(tx).begin(pk, 0)
    return pk


async def test_a_history_is_copied_in_chunks_then_the_consumer_goes_live(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    await setup_channel(client, "k1")
    for n in range(5):
        await publish(client, f"m{n}")
    late = await copying(client, runtime, "late")
    young = await copying(client, runtime, "young")
    # A publish during the copy does not fan out to it: the copy reaches it.
    await publish(client, "during")
    assert await job_rows(runtime, "late") == []
    # Chunks stop at messages younger than 5 s (all here): the switch copies them all.
    step = await BackfillService(runtime.db, chunk=2).step(young, 0)
    assert (step.copied, step.live, step.switched is not None) == (6, True, True)
    service = BackfillService(runtime.db, chunk=2, fresh=timedelta(0))
    step = await service.step(late, 0)
    assert (step.copied, step.live) == (2, False)
    assert len(await job_rows(runtime, "late")) == 2
    # A process holding a stale cursor (another bridge copied that chunk) copies nothing.
    stale = await service.step(late, 0)
    assert (stale.copied, stale.live) == (0, True)
    while not (step := await service.step(late, step.cursor)).live:
        pass
    assert step.switched is not None
    assert await cursor(runtime, late) is None
    await publish(client, "after")  # live: fanned out to it
    pks = await message_pks(runtime)
    for name in ("late", "young"):
        copied = [row.message_pk for row in await job_rows(runtime, name)]
        assert copied == pks, name  # every message once, the jobs' ids in message order
    balances = await ledger(client, runtime)
    # Owed the six copied jobs (its opening balance) and the one publish since it went live.
    assert balances["late"] == (7.0, 0.0, 0.0), balances
    assert balances["young"] == (7.0, 0.0, 0.0), balances
    assert balances["k1"][2] == 0, balances


async def test_a_publish_racing_the_switch_gets_its_job_made_up(
    client: httpx.AsyncClient, runtime: Runtime, rdbms: str
) -> None:
    if "dialect=postgresql" not in rdbms:
        pytest.skip("SQLite writes one transaction at a time: no publish can race a switch")
    await setup_channel(client, "k1")
    await publish(client, "m0")
    late = await copying(client, runtime, "late")
    service = BackfillService(runtime.db)
    async with runtime.db.transaction() as tx:
        # The switch, with a publish started after it locked the channel: the publish's
        # snapshot sees the consumer copying, and its foreign key check waits for the lock.
        assert await BackfillStore(tx).lock_channel(CHANNEL)
        racer = asyncio.ensure_future(publish(client, "racer"))

        async def racer_waits() -> bool:
            rows = await runtime.db.run_alone(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE '%%INSERT INTO message%%'",
                {},
            )
            return bool(rows[0][0])

        await eventually(racer_waits, what="the publish waiting for the channel's lock")
        _, switched = await finish(tx, late, CHANNEL, 0, 500)
        assert switched is not None
    await racer
    await publish(client, "after")
    pks = await message_pks(runtime)
    racer_pk = pks[1]
    assert [row.message_pk for row in await job_rows(runtime, "late")] == [pks[0], pks[2]]
    assert (await ledger(client, runtime))["late"][2] == 0  # not owed it either
    # The switch is recorded in the database: whichever process looks next makes the job up.
    [(recorded, counted)] = await service.switches()
    assert recorded == late
    assert await service.make_up(late, counted) == 1
    assert [row.message_pk for row in await job_rows(runtime, "late")] == [
        pks[0],
        pks[2],
        racer_pk,
    ]
    # A process that read the record before that makes nothing; one that reads it now finds
    # nothing more to make up; once settled, the record is cleared.
    assert await service.make_up(late, counted) is None
    assert await service.switches() == [(late, counted + 1)]
    assert await service.make_up(late, counted + 1) == 0
    assert await service.switches() == [(late, counted + 1)]
    async with runtime.db.transaction() as tx:
        assert await BackfillStore(tx).make_up(late, counted + 1, settle=0) == 0
    assert await service.switches() == []
    assert (await ledger(client, runtime))["late"] == (3.0, 0.0, 0.0)
