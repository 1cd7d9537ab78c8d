"""A consumer's history copied chunk by chunk (app/services/backfill.py), on SQLite and
PostgreSQL: jobs in message order, none twice, publishes during the copy left to it, live
afterwards, a process with a stale cursor copying nothing, the delivery ledger balanced."""

from __future__ import annotations

import httpx
from sqlalchemy import select

from app.runtime import Runtime
from app.services.backfill import BackfillService
from app.store.backfill import BackfillStore
from app.store.schema import consumer, message
from tests.helpers.pull import consumer_pk, job_rows, publish, put_consumer, setup_channel
from tests.test_ledger import ledger


async def message_pks(rt: Runtime) -> list[int]:
    async with rt.db.transaction() as tx:
        return list((await tx.conn.execute(select(message.c.pk).order_by(message.c.pk))).scalars())


async def cursor(rt: Runtime, pk: int) -> int | None:
    async with rt.db.transaction() as tx:
        query = select(consumer.c.backfill_next).where(consumer.c.pk == pk)
        value: int | None = (await tx.conn.execute(query)).scalar_one()
        return value


async def test_a_history_is_copied_in_chunks_then_the_consumer_goes_live(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    await setup_channel(client, "k1")
    for n in range(5):
        await publish(client, f"m{n}")
    # Made after them (no job of theirs), then set to copy the channel from its start, as a
    # consumer made over NATS with deliver policy all is when its history is long.
    await put_consumer(client, "late")
    pk = await consumer_pk(runtime, "late")
    async with runtime.db.transaction() as tx:
        await BackfillStore(tx).begin(pk, 0)
    # A publish during the copy does not fan out to it: the copy reaches it.
    await publish(client, "during")
    assert await job_rows(runtime, "late") == []
    service = BackfillService(runtime.db, chunk=2)
    step = await service.step(pk, 0)
    assert (step.copied, step.live) == (2, False)
    assert len(await job_rows(runtime, "late")) == 2
    # A process holding a stale cursor (another bridge copied that chunk) copies nothing.
    stale = await service.step(pk, 0)
    assert (stale.copied, stale.live) == (0, True)
    while not (step := await service.step(pk, step.cursor)).live:
        pass
    assert await cursor(runtime, pk) is None
    await publish(client, "after")  # live: fanned out to it
    pks = await message_pks(runtime)
    copied = [row.message_pk for row in await job_rows(runtime, "late")]
    assert copied == pks  # every message once, the jobs' ids in message order
    balances = await ledger(client, runtime)
    # Owed the six copied jobs (its opening balance) and the one publish since it went live.
    assert balances["late"] == (7.0, 0.0, 0.0), balances
    assert balances["k1"][2] == 0, balances
