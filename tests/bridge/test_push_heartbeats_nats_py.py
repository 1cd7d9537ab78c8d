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

import httpx
import nats
import pytest
from nats.aio.msg import Msg

from tests.bridge.conftest import BridgeFactory, uncapped_only
from tests.helpers.natsproc import NatsServer
from tests.helpers.side_by_side import Publish, http_publisher, on_jetstream


async def script(url: str, publish: Publish) -> list[bytes]:
    """Two deliveries, an idle heartbeat, a third delivery; what arrives."""
    nc = await nats.connect(url)
    watcher = await nats.connect(url)
    got: asyncio.Queue[Msg] = asyncio.Queue()
    try:
        sub = await nc.jetstream().subscribe(
            "orders", durable="hbd", stream="orders", cb=got.put, idle_heartbeat=0.5
        )
        deliver = sub._sub._subject  # noqa: SLF001 (the inbox nats-py made)
        beats = await watcher.subscribe(deliver)
        await publish(["first", "second"])
        # Deadlines, not paces: a CI run once saw real JetStream take past 10 s here under load.
        arrived = [(await asyncio.wait_for(got.get(), 30)).data for _ in range(2)]
        # An idle heartbeat after the deliveries (Nats-Last-Consumer 2): nats-py checks it
        # against the last delivery's reply.
        while not ((await beats.next_msg(timeout=15)).headers or {}).get("Status"):
            pass
        await publish(["third"])
        arrived.append((await asyncio.wait_for(got.get(), 30)).data)
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
