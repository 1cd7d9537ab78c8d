"""nats-py's ordered consumer (`js.subscribe(..., ordered_consumer=True)`), unmodified: a push
consumer it makes itself (ephemeral, AckNone, flow control, idle heartbeats), recreated by
start sequence after a gap in the delivery sequence or missed heartbeats. The same script
reads a channel's 10,000 stored messages in order from real nats-server 2.15 JetStream and
from the bridge, which is restarted while the client reads: the client recovers on its own."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import nats
from nats.aio.msg import Msg
from sqlalchemy import text

from app.runtime import Runtime
from tests.bridge.conftest import PUBLISH_HEADERS, BridgeFactory, uncapped_only
from tests.helpers.natsproc import NatsServer
from tests.helpers.side_by_side import (
    Publish,
    in_stream_order,
    on_jetstream,
    publish_http_at_once,
    reference,
    stream_order,
)
from tests.helpers.waiting import eventually

COUNT = 10_000
NAMES = [f"o{i:05d}" for i in range(COUNT)]
# The client's heartbeat (its own setting, the same on both sides): two missed ones, and it
# makes its consumer again from the last stream sequence it saw.
HEARTBEAT = 1.0


class Reader:
    """An ordered push subscription collecting (data, stream sequence) in arrival order."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.got: list[tuple[str, int]] = []
        self.errors: list[str] = []
        self.consumers: set[str] = set()
        self.done = asyncio.Event()

    async def on_message(self, msg: Msg) -> None:
        # A message's first bytes name it (the big ones are padded after them).
        self.got.append((msg.data[:6].decode(), msg.metadata.sequence.stream))
        self.consumers.add(msg.metadata.consumer)
        if len(self.got) >= self.count:
            self.done.set()

    async def on_error(self, exc: Exception) -> None:
        self.errors.append(repr(exc))


async def read_in_order(
    url: str, during: Callable[[Reader], Awaitable[None]] | None = None, count: int = COUNT
) -> Reader:
    reader = Reader(count)
    nc = await nats.connect(url, error_cb=reader.on_error)
    try:
        js = nc.jetstream()
        await js.subscribe(
            "orders",
            stream="orders",
            cb=reader.on_message,
            ordered_consumer=True,
            idle_heartbeat=HEARTBEAT,
        )
        if during is not None:
            await during(reader)
        await asyncio.wait_for(reader.done.wait(), 600)
    finally:
        await nc.close()
    return reader


async def read_published(url: str, publish: Publish) -> tuple[bool, bool, int]:
    """The reference's read: the messages published over NATS first."""
    await publish(NAMES)
    return in_stream_order((await read_in_order(url)).got, NAMES)


async def sent_to_ephemerals(runtime: Runtime) -> int:
    """Jobs of the channel's ephemeral consumers sent so far (AckNone: DELIVERED as sent)."""
    async with runtime.db.transaction() as tx:
        rows = await tx.conn.execute(
            text(
                "SELECT count(*) FROM job JOIN consumer ON consumer.pk = job.consumer_pk"
                " WHERE consumer.channel_id = 'orders' AND consumer.ephemeral"
                " AND job.status = 'DELIVERED'"
            )
        )
        return int(rows.scalar_one())


@uncapped_only
async def test_nats_py_ordered_push_consumer_reads_10000_in_order_across_a_bridge_restart(
    jetstream_server: NatsServer,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
    runtime: Runtime,
) -> None:
    expected = await reference(jetstream_server, read_published, workers=False)
    assert expected == (True, True, COUNT)

    await publish_http_at_once(client, NAMES)
    order = await stream_order(runtime)
    assert sorted(order) == NAMES

    # Hybrid: nats-py's ordered consumer reads its sequences from a $JS.ACK reply (the
    # client table).
    bridge = await make_bridge("hybrid")
    at_restart: list[int] = []

    async def restart(reader: Reader) -> None:
        async def a_quarter_sent() -> int:
            count = await sent_to_ephemerals(runtime)
            return count if count >= COUNT // 4 else 0

        at_restart.append(await eventually(a_quarter_sent, timeout=120, what="a quarter sent"))
        await bridge.stop()
        # Down until the client has missed its heartbeats and tried to make its consumer
        # again (nobody answers that request yet), so the new bridge meets a new consumer
        # starting from the sequence after the last one read.
        await eventually(lambda: reader.errors, timeout=60, what="the client's re-creation")
        await make_bridge("hybrid")

    reader = await read_in_order(hub.url, restart)
    assert in_stream_order(reader.got, order) == expected
    assert at_restart[0] < COUNT, "the bridge restarted after the client had read everything"
    # It read on from a consumer of its own making, by start sequence.
    assert len(reader.consumers) >= 2, reader.consumers


BIG = 64 * 1024
# 3 MiB: past the first flow control window (2 MiB), which the client answers.
BIG_NAMES = [f"b{i:05d}" for i in range(48)]


def padded(name: str) -> bytes:
    return name.encode().ljust(BIG, b".")


async def flow_controlled_read(url: str) -> tuple[tuple[bool, bool, int], int, int]:
    """(in order, sequences rising, how many; consumers used; errors) of the big messages."""
    reader = await read_in_order(url, count=len(BIG_NAMES))
    return in_stream_order(reader.got, BIG_NAMES), len(reader.consumers), len(reader.errors)


@uncapped_only
async def test_nats_py_ordered_push_consumer_through_flow_control(
    jetstream_server: NatsServer,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
) -> None:
    async with on_jetstream(jetstream_server, workers=False) as side:
        await side.publish([padded(name) for name in BIG_NAMES])
        expected = await flow_controlled_read(side.url)
    # One consumer all along: no gap ever made it start again.
    assert expected == ((True, True, len(BIG_NAMES)), 1, 0)

    for name in BIG_NAMES:
        response = await client.post(
            "/channel/orders/broadcast",
            content=padded(name),
            headers={**PUBLISH_HEADERS, "X-Broker-Message-ID": name},
        )
        assert response.status_code == 201, response.text
    await make_bridge("hybrid")
    assert await flow_controlled_read(hub.url) == expected
