"""A push consumer stops delivering at max_ack_pending and resumes as acks come, the same
script against real nats-server 2.15 JetStream and the bridge (both transports): with three
allowed unacknowledged, three of six jobs arrive and the consumer goes idle (two idle
heartbeats in a row, nothing between them); one ack lets exactly one more out; the rest
come once those are acked."""

from __future__ import annotations

from typing import Any

import httpx
import nats
import pytest
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from app.bridge import protocol as p
from tests.bridge.conftest import BridgeFactory, uncapped_only
from tests.helpers.consumer_management import create_body, pushed_config, request
from tests.helpers.natsproc import NatsServer
from tests.helpers.side_by_side import Publish, http_publisher, reference
from tests.helpers.waiting import eventually

LIMIT = 3


def is_status(msg: Msg) -> bool:
    return bool((msg.headers or {}).get("Status"))


async def until_idle(sub: Subscription, want: int) -> list[Msg]:
    """At least `want` deliveries, then until two idle heartbeats arrive with no delivery
    between them: what was delivered before the consumer stopped."""
    got: list[Msg] = []
    beats = 0
    while len(got) < want or beats < 2:
        msg = await sub.next_msg(timeout=10)
        if is_status(msg):
            beats += 1 if len(got) >= want else 0
            continue
        got.append(msg)
        beats = 0
    return got


async def max_ack_pending_script(url: str, publish: Publish) -> dict[str, Any]:
    nc = await nats.connect(url)
    r: dict[str, Any] = {}
    try:
        sub = await nc.subscribe("push.map")
        created = await request(
            nc,
            "CONSUMER.CREATE.orders.map",
            create_body(
                {
                    "durable_name": "map",
                    "deliver_subject": "push.map",
                    "ack_policy": "explicit",
                    "ack_wait": 60 * p.NANOS,
                    "max_ack_pending": LIMIT,
                    "idle_heartbeat": p.NANOS // 2,
                    "filter_subject": "orders",
                }
            ),
        )
        r["config"] = pushed_config(created) | {
            "max_ack_pending": created["config"]["max_ack_pending"]
        }
        await publish([f"m{i}" for i in range(6)])

        async def counts() -> tuple[int, int]:
            info = await request(nc, "CONSUMER.INFO.orders.map")
            return info["num_ack_pending"], info["num_pending"]

        first = await until_idle(sub, LIMIT)
        r["first"] = [m.data for m in first]
        r["stopped"] = await counts()
        await first[0].ack_sync()
        second = await until_idle(sub, 1)
        r["after_one_ack"] = [m.data for m in second]
        for msg in [*first[1:], *second]:
            await msg.ack_sync()
        rest = await until_idle(sub, 2)
        r["after_all_acks"] = [m.data for m in rest]
        for msg in rest:
            await msg.ack_sync()

        async def settled() -> tuple[int, int] | None:
            now = await counts()
            return now if now == (0, 0) else None

        r["settled"] = await eventually(settled, what="every job acked")
    finally:
        await nc.close()
    return r


@uncapped_only
@pytest.mark.parametrize("mode", ["client", "hybrid"])
async def test_a_push_consumer_stops_at_max_ack_pending_and_resumes_on_acks(
    mode: str,
    jetstream_server: NatsServer,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
) -> None:
    expected = await reference(jetstream_server, max_ack_pending_script)
    assert expected["first"] == [b"m0", b"m1", b"m2"]
    assert expected["stopped"] == (LIMIT, 3)
    assert expected["after_one_ack"] == [b"m3"]
    assert expected["after_all_acks"] == [b"m4", b"m5"]
    await make_bridge(mode)
    assert await max_ack_pending_script(hub.url, http_publisher(client)) == expected
