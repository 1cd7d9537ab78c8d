"""Ordered consumers as @nats-io/jetstream and nats-jetstream build them (an ephemeral AckNone
consumer from a start, recreated from the last stream sequence seen after a gap): the same
script reads a channel's 10,000 stored messages in order from real nats-server 2.15 JetStream
and from the bridge, which is restarted while the client reads (the client recovers on its
own: a pull that stops beating, a gap in the delivery sequence, a new consumer
by_start_sequence whose history the new bridge copies)."""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from app.runtime import Runtime
from tests.bridge.conftest import BridgeFactory
from tests.helpers.js_clients import ClientProcess, install
from tests.helpers.natsproc import NatsServer
from tests.helpers.side_by_side import (
    Publish,
    in_stream_order,
    publish_http_at_once,
    reference,
    stream_order,
)
from tests.helpers.waiting import eventually

COUNT = 10_000
KINDS = ("js", "nats-jetstream")
# The clients' own pull settings: batches of 200 (the bridge's [pull] max-batch is 256, which a
# request beyond gets 409 as from nats-server), a 4 s expiry (heartbeats every 2 s, so a bridge
# gone quiet is noticed within seconds).
PULL = {"max_messages": 200, "expires": 4000}
NAMES = [f"o{i:05d}" for i in range(COUNT)]


async def read_in_order(
    kind: str,
    url: str,
    during: Callable[[], Awaitable[None]] | None = None,
) -> list[list[Any]]:
    """[data, stream sequence] of the COUNT messages the client's ordered consumer reads;
    `during` runs while it reads."""
    client = await ClientProcess.start(kind)
    try:
        await client.call("connect", servers=url)
        await client.call("ordered", stream="orders")
        reading = asyncio.ensure_future(client.call("readOrdered", within=600, count=COUNT, **PULL))
        if during is not None:
            await during()
        got: list[list[Any]] = await reading
        return got
    finally:
        await client.close()


async def read_published(kind: str, url: str, publish: Publish) -> tuple[bool, bool, int]:
    """The reference's read: the messages published over NATS first."""
    await publish(NAMES)
    return in_stream_order(await read_in_order(kind, url), NAMES)


async def message_pks(runtime: Runtime) -> list[int]:
    async with runtime.db.transaction() as tx:
        rows = await tx.conn.execute(
            text("SELECT pk FROM message WHERE channel_id = 'orders' ORDER BY pk")
        )
        return [int(v) for v in rows.scalars()]


@pytest.mark.parametrize("cap", ["uncapped"])
@pytest.mark.parametrize("kind", KINDS)
async def test_an_ordered_consumer_reads_10000_messages_in_order_across_a_bridge_restart(
    kind: str,
    jetstream_server: NatsServer,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
    runtime: Runtime,
) -> None:
    install()
    expected = await reference(jetstream_server, read_published, kind, workers=False)
    assert expected == (True, True, COUNT)

    await publish_http_at_once(client, NAMES)
    order = await stream_order(runtime)
    assert sorted(order) == NAMES

    bridge = await make_bridge("hybrid")  # the JS client needs hybrid (the client table)

    pks = await message_pks(runtime)

    async def delivered() -> int:
        """How far the client has read: the position of the furthest message delivered (an
        ordered consumer acknowledges nothing, a job is DELIVERED as it is sent; the consumers
        it replaced are gone with their jobs)."""
        async with runtime.db.transaction() as tx:
            rows = await tx.conn.execute(
                text(
                    "SELECT max(job.message_pk) FROM job"
                    " JOIN consumer ON consumer.pk = job.consumer_pk"
                    " WHERE consumer.channel_id = 'orders' AND consumer.ephemeral"
                    " AND job.status = 'DELIVERED'"
                )
            )
            furthest = rows.scalar_one()
        return 0 if furthest is None else bisect.bisect_right(pks, int(furthest))

    at_restart: list[int] = []

    async def restart() -> None:
        async def a_quarter_read() -> int:
            count = await delivered()
            return count if count >= COUNT // 4 else 0

        at_restart.append(await eventually(a_quarter_read, timeout=120, what="a quarter read"))
        await bridge.stop()
        await make_bridge("hybrid")

    got = await read_in_order(kind, hub.url, restart)
    assert in_stream_order(got, order) == expected
    assert at_restart[0] < COUNT, "the bridge restarted before the client had read everything"
    async with runtime.db.transaction() as tx:
        copying = await tx.conn.execute(
            text("SELECT count(*) FROM consumer WHERE backfill_next IS NOT NULL")
        )
        assert copying.scalar_one() == 0
