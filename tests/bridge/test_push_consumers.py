"""Push consumers over NATS: the same scripts against real nats-server 2.15 JetStream and the
bridge (both transports), the same answers from both. nats-py's `js.subscribe` with a durable
(it creates the push consumer, then subscribes to its deliver subject) and with a queue group
(two members splitting the jobs); flow control, seen on a plain subscription that does not
answer it: the deliveries stop once the window is full and the idle heartbeats say
`Nats-Consumer-Stalled` until the request is answered; idle heartbeats with the last
sequences."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import nats
import pytest

from app.bridge import protocol as p
from tests.bridge.conftest import BridgeFactory, uncapped_only
from tests.helpers.consumer_management import create_body, pushed_config, request
from tests.helpers.natsproc import NatsServer
from tests.helpers.side_by_side import Publish, http_publisher, reference
from tests.helpers.waiting import eventually

NANOS = p.NANOS


def sequences(reply: str) -> tuple[int, int]:
    """(stream sequence, consumer sequence) of a delivery's ack reply, in either form:
    `...<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>...`."""
    tokens = reply.split("@")[0].split(".")
    at = tokens.index("orders")
    return int(tokens[at + 3]), int(tokens[at + 4])


async def durable_script(url: str, publish: Publish) -> dict[str, Any]:
    nc = await nats.connect(url)
    r: dict[str, Any] = {}
    try:
        js = nc.jetstream()
        got: asyncio.Queue[Any] = asyncio.Queue()
        sub = await js.subscribe("orders", durable="pd", cb=got.put, manual_ack=True)
        info = await request(nc, "CONSUMER.INFO.orders.pd")
        r["config"] = pushed_config(info)
        await publish(["p1", "p2", "p3"])
        received = [await asyncio.wait_for(got.get(), 10) for _ in range(3)]
        r["data"] = [m.data for m in received]
        r["consumer_seqs"] = [sequences(m.reply)[1] for m in received]
        for m in received:
            await m.ack_sync()

        async def settled() -> Any:
            answer = await request(nc, "CONSUMER.INFO.orders.pd")
            return answer if answer["num_ack_pending"] == 0 else None

        settled_info = await eventually(settled, timeout=10)
        r["settled"] = (
            settled_info["num_ack_pending"],
            settled_info["num_pending"],
            settled_info["delivered"]["consumer_seq"],
            settled_info["num_waiting"],
        )
        # A pull request on a push consumer is refused, as nats-server refuses it.
        reply = await nc.request(
            "$JS.API.CONSUMER.MSG.NEXT.orders.pd", b'{"batch":1,"no_wait":true}', timeout=5
        )
        r["pulled"] = (
            (reply.headers or {}).get("Status"),
            (reply.headers or {}).get("Description"),
        )
        await sub.unsubscribe()
    finally:
        await nc.close()
    return r


async def queue_script(url: str, publish: Publish) -> dict[str, Any]:
    first = await nats.connect(url)
    second = await nats.connect(url)
    r: dict[str, Any] = {}
    try:
        got: dict[str, list[bytes]] = {"a": [], "b": []}

        def collector(member: str) -> Callable[[Any], Awaitable[None]]:
            async def cb(msg: Any) -> None:
                got[member].append(msg.data)
                await msg.ack()

            return cb

        await first.jetstream().subscribe("orders", queue="grp", cb=collector("a"))
        await second.jetstream().subscribe("orders", queue="grp", cb=collector("b"))
        # Its SUB on the server before the first publish, or the first member may take them all.
        await second.flush()
        info = await request(first, "CONSUMER.INFO.orders.grp")
        r["config"] = pushed_config(info)
        names = [f"q{i:02d}" for i in range(30)]
        await publish(names)
        await eventually(lambda: len(got["a"]) + len(got["b"]) >= 30, timeout=15)
        r["all_once"] = sorted(got["a"] + got["b"]) == [n.encode() for n in names]
        r["both_members"] = bool(got["a"]) and bool(got["b"])
    finally:
        await first.close()
        await second.close()
    return r


BIG = 64 * 1024
MESSAGES = 48  # 3 MiB: past the first flow-control window (2 MiB)


async def flow_control_script(url: str, publish: Publish) -> dict[str, Any]:
    nc = await nats.connect(url)
    r: dict[str, Any] = {}
    try:
        sub = await nc.subscribe("push.fc")
        created = await request(
            nc,
            "CONSUMER.CREATE.orders.fc",
            create_body(
                {
                    "durable_name": "fc",
                    "deliver_subject": "push.fc",
                    "ack_policy": "explicit",
                    "flow_control": True,
                    "idle_heartbeat": NANOS // 2,
                    "filter_subject": "orders",
                }
            ),
        )
        r["config"] = pushed_config(created)
        await publish([bytes([65 + i % 26]) * BIG for i in range(MESSAGES)])
        data = 0
        fc_requests: list[str] = []
        stalled: str | None = None
        # Until a heartbeat says the consumer is stalled on the request it waits for.
        while stalled is None:
            msg = await sub.next_msg(timeout=10)
            headers = msg.headers or {}
            if headers.get("Status") == "100":
                if headers.get("Description") == "FlowControl Request":
                    fc_requests.append(msg.reply)
                else:
                    stalled = headers.get("Nats-Consumer-Stalled")
                continue
            data += 1
        r["stalled_on_request"] = stalled == fc_requests[-1]
        r["stopped_before_all"] = 0 < data < MESSAGES
        r["requests_before_stall"] = len(fc_requests)
        r["window_reached"] = data * BIG > 2 * 1024 * 1024 - BIG
        # Answering lets the rest come.
        await nc.publish(fc_requests[-1], b"")
        while data < MESSAGES:
            msg = await sub.next_msg(timeout=10)
            headers = msg.headers or {}
            if headers.get("Status") == "100":
                if msg.reply:
                    await nc.publish(msg.reply, b"")
                continue
            data += 1
        r["all_delivered"] = data
    finally:
        await nc.close()
    return r


async def heartbeat_script(url: str, publish: Publish) -> dict[str, Any]:
    nc = await nats.connect(url)
    r: dict[str, Any] = {}
    try:
        sub = await nc.subscribe("push.hb")
        created = await request(
            nc,
            "CONSUMER.CREATE.orders.hb",
            create_body(
                {
                    "durable_name": "hb",
                    "deliver_subject": "push.hb",
                    "ack_policy": "explicit",
                    "idle_heartbeat": NANOS // 2,
                    "filter_subject": "orders",
                }
            ),
        )
        r["config"] = pushed_config(created)
        beat = await sub.next_msg(timeout=5)
        headers = beat.headers or {}
        r["idle"] = (
            headers.get("Status"),
            headers.get("Description"),
            headers.get("Nats-Last-Consumer"),
            headers.get("Nats-Last-Stream"),
            beat.reply,
            beat.data,
        )
        await publish(["h1"])
        while True:
            msg = await sub.next_msg(timeout=5)
            if not (msg.headers or {}).get("Status"):
                break
        stream_seq, consumer_seq = sequences(msg.reply)
        await nc.publish(msg.reply, b"+ACK")
        beat = await sub.next_msg(timeout=5)
        headers = beat.headers or {}
        r["after_delivery"] = (
            headers.get("Description"),
            headers.get("Nats-Last-Consumer") == str(consumer_seq),
            headers.get("Nats-Last-Stream") == str(stream_seq),
            consumer_seq,
        )
        # Refusals of a push config, in nats-server's words.
        r["wildcard"] = (
            await request(
                nc,
                "CONSUMER.CREATE.orders.bad",
                create_body({"durable_name": "bad", "deliver_subject": "push.*"}),
            )
        ).get("error")
        r["fc_without_heartbeat"] = (
            await request(
                nc,
                "CONSUMER.CREATE.orders.bad",
                create_body(
                    {"durable_name": "bad", "deliver_subject": "push.x", "flow_control": True}
                ),
            )
        ).get("error")
        r["push_max_waiting"] = (
            await request(
                nc,
                "CONSUMER.CREATE.orders.bad",
                create_body({"durable_name": "bad", "deliver_subject": "push.x", "max_waiting": 3}),
            )
        ).get("error")
        r["cycle"] = (
            await request(
                nc,
                "CONSUMER.CREATE.orders.bad",
                create_body({"durable_name": "bad", "deliver_subject": "orders"}),
            )
        ).get("error")
        r["heartbeat_update"] = (
            await request(
                nc,
                "CONSUMER.CREATE.orders.hb",
                create_body(
                    {
                        "durable_name": "hb",
                        "deliver_subject": "push.hb",
                        "ack_policy": "explicit",
                        "idle_heartbeat": NANOS,
                        "filter_subject": "orders",
                    }
                ),
            )
        ).get("error")
    finally:
        await nc.close()
    return r


MODES = pytest.mark.parametrize("mode", ["client", "hybrid"])


@uncapped_only
@MODES
async def test_a_push_durable_with_nats_py(
    mode: str,
    jetstream_server: NatsServer,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
) -> None:
    expected = await reference(jetstream_server, durable_script)
    assert expected["data"] == [b"p1", b"p2", b"p3"]
    assert expected["pulled"] == ("409", "Consumer is push based")
    assert expected["config"]["has_deliver_subject"] is True
    await make_bridge(mode)
    assert await durable_script(hub.url, http_publisher(client)) == expected


@uncapped_only
@MODES
async def test_a_push_queue_group_splits_the_jobs(
    mode: str,
    jetstream_server: NatsServer,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
) -> None:
    expected = await reference(jetstream_server, queue_script)
    assert expected["config"]["deliver_group"] == "grp"
    assert expected["all_once"] and expected["both_members"]
    await make_bridge(mode)
    assert await queue_script(hub.url, http_publisher(client)) == expected


@uncapped_only
@MODES
async def test_flow_control_stalls_until_answered(
    mode: str,
    jetstream_server: NatsServer,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
) -> None:
    expected = await reference(jetstream_server, flow_control_script)
    assert expected["stalled_on_request"] and expected["stopped_before_all"]
    assert expected["all_delivered"] == MESSAGES
    await make_bridge(mode)
    assert await flow_control_script(hub.url, http_publisher(client)) == expected


@uncapped_only
@MODES
async def test_idle_heartbeats(
    mode: str,
    jetstream_server: NatsServer,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
) -> None:
    expected = await reference(jetstream_server, heartbeat_script)
    assert expected["idle"] == ("100", "Idle Heartbeat", "0", "0", "", b"")
    assert expected["after_delivery"] == ("Idle Heartbeat", True, True, 1)
    await make_bridge(mode)
    actual = await heartbeat_script(hub.url, http_publisher(client))
    assert actual == expected, json.dumps({"actual": actual, "expected": expected}, default=str)
