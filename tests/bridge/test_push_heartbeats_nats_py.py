"""nats-py's push subscription with idle heartbeats on a consumer that acknowledges: after a
delivery, nats-py checks each idle heartbeat against the delivery's reply subject, reading
the sequences from fixed tokens of nats-server's form (`$JS.ACK.<stream>.<consumer>.
<delivered>.<sseq>.<dseq>...`); a reply of another form (the domain and hash tokens shift
them; client mode's `$WB.ACK` is no JetStream reply) makes it raise, which stops the
connection's read loop: nothing more would arrive. The same script against real JetStream
and the bridge: two deliveries, an idle heartbeat, a third delivery. Hybrid mode only: in
client mode the reply is under `$WB.ACK`, a listed difference, kept here as a strict xfail."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

import httpx
import nats
import pytest
from nats.aio.msg import Msg

from tests.bridge.conftest import BridgeFactory, uncapped_only
from tests.helpers.natsproc import NatsServer
from tests.helpers.side_by_side import Publish, http_publisher, on_jetstream

T = TypeVar("T")


def is_status(msg: Msg) -> bool:
    """A status message (an idle heartbeat here), not a delivery."""
    return bool((msg.headers or {}).get("Status"))


def shown(msg: Msg) -> object:
    """A message on the deliver subject as a failure reports it: a delivery's payload and
    reply, a status message's headers."""
    return dict(msg.headers or {}) if is_status(msg) else (msg.data, msg.reply)


async def script(url: str, publish: Publish) -> list[bytes]:
    """Two deliveries, an idle heartbeat, a third delivery; what arrives."""
    errors: list[Exception] = []

    async def record(error: Exception) -> None:
        errors.append(error)

    nc = await nats.connect(url, error_cb=record)
    watcher = await nats.connect(url, error_cb=record)
    got: asyncio.Queue[Msg] = asyncio.Queue()
    seen: list[Msg] = []
    beat_after_deliveries = asyncio.Event()

    async def watch(msg: Msg) -> None:
        # The deliver subject's own order: a heartbeat after the second delivery was sent
        # after it (one seen later here, but sent earlier, would check nothing).
        if is_status(msg) and any(m.data == b"second" for m in seen):
            beat_after_deliveries.set()
        seen.append(msg)

    async def within(waited: Awaitable[T], seconds: float, what: str) -> T:
        """`waited`, or a TimeoutError that says what nats-py reported and what the deliver
        subject carried (deliveries and heartbeats, as the watcher saw them)."""
        try:
            return await asyncio.wait_for(waited, seconds)
        except TimeoutError:
            raise TimeoutError(
                f"no {what} within {seconds} s; nats-py's errors: {errors!r}; "
                f"the deliver subject carried: {[shown(m) for m in seen]!r}"
            ) from None

    try:
        sub = await nc.jetstream().subscribe(
            "orders", durable="hbd", stream="orders", cb=got.put, idle_heartbeat=0.5
        )
        # nats-py's subscribe returns before its SUB has reached the server. Were the
        # watcher's SUB (another connection) there first, the consumer would deliver the first
        # message to the watcher alone, which never acks it (redelivered only after the 30 s
        # ack wait): the subscription would miss it. So the SUBs go in order, round trips.
        await nc.flush()
        deliver = sub._sub._subject  # noqa: SLF001 (the inbox nats-py made)
        await watcher.subscribe(deliver, cb=watch)
        await watcher.flush()
        await publish(["first", "second"])
        # Deadlines, not paces.
        arrived = [(await within(got.get(), 30, "delivery")).data for _ in range(2)]
        # An idle heartbeat after the deliveries (Nats-Last-Consumer 2): nats-py checks it
        # against the last delivery's reply.
        await within(beat_after_deliveries.wait(), 15, "idle heartbeat after the deliveries")
        await publish(["third"])
        arrived.append((await within(got.get(), 30, "delivery after the heartbeat")).data)
        return arrived
    finally:
        await nc.close()
        await watcher.close()


@uncapped_only
@pytest.mark.parametrize(
    "mode",
    [
        pytest.param(
            "client",
            marks=pytest.mark.xfail(
                strict=True,
                raises=TimeoutError,
                reason="client mode: the reply is under $WB.ACK (the client table)",
            ),
        ),
        "hybrid",
    ],
)
async def test_nats_py_push_with_heartbeats_goes_on_after_a_heartbeat(
    mode: str,
    jetstream_server: NatsServer,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
) -> None:
    # The script holds on real JetStream.
    async with on_jetstream(jetstream_server) as side:
        assert await script(side.url, side.publish) == [b"first", b"second", b"third"]

    await make_bridge(mode)
    assert await script(hub.url, http_publisher(client)) == [b"first", b"second", b"third"]
