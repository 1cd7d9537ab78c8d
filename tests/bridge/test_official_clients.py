"""Two official NATS clients besides nats-py each run one scenario against real JetStream and
against the bridge in hybrid mode; what each observes must be the same on both: subjects,
message info (stream, consumer, delivery count, sequences, pending), headers, redelivery after
a nak with delay and after an ack wait, `working`, `term`, expiry, and consumer info. Then each
consumes 300 jobs with its continuous-consumption API and acks each.

- `js`: the JavaScript client, @nats-io/jetstream 3.4 on @nats-io/transport-node
  (tests/js/client.mjs; `npm ci` in tests/js from the committed lockfile).
- `nats-jetstream`: the newer Python client built on the simplified consumer API (PyPI
  `nats-jetstream` on `nats-core`, which need Python 3.13: tests/clients/nats_jetstream_client.py
  in the venv `.venv-nats-jetstream` that scripts/test makes).

Both speak the same JSON-lines commands. Only the hybrid transport serves the JS client: it
decides that a message is a protocol message when its subject is the request inbox, so
deliveries must carry the stored subject, which only a leafnode link can give them (see the
client table in docs/guides/nats-bridge.md)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import nats
import pytest
from nats.js import JetStreamContext
from sqlalchemy import text

from app.runtime import Runtime
from tests.bridge.conftest import ACK_WAIT, BridgeFactory, publish_http
from tests.helpers.jetstream import until_consumer
from tests.helpers.js_clients import ClientProcess, install
from tests.helpers.natsproc import NatsServer
from tests.helpers.side_by_side import Publish, as_http, http_publisher, reference
from tests.helpers.waiting import eventually

KINDS = ("js", "nats-jetstream")


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    install()
    return str(request.param)


@pytest.fixture
async def official_client(kind: str) -> AsyncIterator[ClientProcess]:
    client = await ClientProcess.start(kind)
    try:
        yield client
    finally:
        await client.close()


def seen(messages: list[dict[str, Any]] | dict[str, Any] | None) -> Any:
    """What is compared of received messages: everything but the client's own handle."""
    if messages is None:
        return None
    if isinstance(messages, dict):
        return {k: v for k, v in messages.items() if k != "handle"}
    return [seen(m) for m in messages]


async def scenario(js: ClientProcess, url: str, publish: Publish) -> dict[str, Any]:
    # The client under test's state is read on a connection of the test's own, the same way on
    # both sides (tests.helpers.jetstream).
    watcher = await nats.connect(url)
    try:
        return await steps(js, url, publish, watcher.jetstream())
    finally:
        await watcher.close()


async def steps(
    js: ClientProcess, url: str, publish: Publish, watch: JetStreamContext
) -> dict[str, Any]:
    r: dict[str, Any] = {}
    # checkAPI: the client asks $JS.API.INFO whether JetStream is there before its first use.
    await js.call("connect", servers=url, checkApi=True)
    r["manager"] = (await js.call("manager"))["api_level"] is not None
    await js.call("consumer", stream="orders", name="workers")

    await publish(["m1", "m2", "m3", "m4"])
    await until_consumer(watch, "orders", "workers", num_pending=4)
    [m1] = await js.call("fetch", max_messages=1, expires=2000)
    r["fetch1"] = seen(m1)
    await js.call("ack", handle=m1["handle"])
    # Expires well inside the ack wait: a fetch that is not filled returns at its expiry,
    # and its messages are acked after that.
    three = await js.call("fetch", max_messages=5, expires=1000)
    r["fetch5_of_3"] = seen(three)
    r["ack_ack"] = await js.call("ackAck", handle=three[0]["handle"])
    for m in three[1:]:
        await js.call("ack", handle=m["handle"])
    r["empty_next"] = await js.call("next", expires=1000)
    r["empty_fetch"] = await js.call("fetch", max_messages=3, expires=1000, idle_heartbeat=500)
    # A client stops reading an empty fetch at its own clock's expiry, a little before the
    # server's: a message published while the server still holds that request goes to an
    # inbox nobody reads, and comes back only after the ack wait (on a busy machine, twice
    # delivered before the nak below).
    await until_consumer(watch, "orders", "workers", num_waiting=0)

    await publish(["m5"])
    m5 = await js.call("next", expires=2000)
    r["next"] = seen(m5)
    await js.call("nak", handle=m5["handle"], delay=300)
    again = await js.call("next", expires=3000)
    r["nak_redelivery"] = seen(again)
    await js.call("ack", handle=again["handle"])

    # working keeps m6 past its ack wait; m7, left alone, lapses and comes back.
    await publish(["m6", "m7"])
    await until_consumer(watch, "orders", "workers", num_pending=2)
    held, lapsing = await js.call("fetch", max_messages=2, expires=2000)
    r["held"] = seen([held, lapsing])
    for _ in range(2):
        await asyncio.sleep(ACK_WAIT * 0.6)
        await js.call("working", handle=held["handle"])
        await js.call("flush")
    await asyncio.sleep(ACK_WAIT * 0.55)
    r["held_ack"] = await js.call("ackAck", handle=held["handle"])
    lapsed = await js.call("next", expires=3000)
    r["lapsed"] = seen(lapsed)
    await js.call("ackAck", handle=lapsed["handle"])

    await publish(["m8"])
    doomed = await js.call("next", expires=2000)
    r["doomed"] = seen(doomed)
    await js.call("term", handle=doomed["handle"], reason="not wanted")
    await js.call("flush")
    r["after_term"] = await js.call("next", expires=1000)
    await until_consumer(watch, "orders", "workers", acks_settled=True, num_waiting=0)

    await publish([f"c{n}" for n in range(5)])
    consumed = await js.call("consume", count=5, max_messages=10, ack=True)
    r["consume"] = seen(consumed)
    await js.call("flush")
    await until_consumer(watch, "orders", "workers", acks_settled=True, num_pending=0)
    r["info"] = await js.call("info")
    await js.call("close")
    return r


async def run_scenario(kind: str, url: str, publish: Publish) -> dict[str, Any]:
    """The scenario in a client process of its own."""
    client = await ClientProcess.start(kind)
    try:
        return await scenario(client, url, publish)
    finally:
        await client.close()


def message(data: str, stream_seq: int, consumer_seq: int, pending: int, count: int = 1) -> Any:
    return {
        "subject": "orders",
        "data": data,
        "headers": {"Content-Type": "text/plain", "X-Order": data, "Nats-Msg-Id": data},
        "info": {
            "stream": "orders",
            "consumer": "workers",
            "deliveryCount": count,
            "redelivered": count > 1,
            "streamSequence": stream_seq,
            "deliverySequence": consumer_seq,
            "pending": pending,
        },
    }


@pytest.mark.parametrize("cap", ["uncapped"])
async def test_the_client_sees_the_bridge_as_it_sees_jetstream(
    jetstream_server: NatsServer,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
    kind: str,
) -> None:
    expected = await reference(jetstream_server, run_scenario, kind, headers=as_http)
    # The reference itself, so that a broken scenario cannot pass by matching nothing.
    assert expected["fetch1"] == message("m1", 1, 1, 3)
    assert [m["data"] for m in expected["fetch5_of_3"]] == ["m2", "m3", "m4"]
    assert expected["empty_next"] is None and expected["empty_fetch"] == []
    assert expected["nak_redelivery"]["info"]["deliveryCount"] == 2
    assert expected["lapsed"]["info"]["deliveryCount"] == 2
    assert expected["after_term"] is None
    assert len(expected["consume"]) == 5

    await make_bridge("hybrid")
    actual = await run_scenario(kind, hub.url, http_publisher(client))
    for key, value in expected.items():
        assert actual[key] == value, key
    assert actual.keys() == expected.keys()


@pytest.mark.parametrize("cap", ["uncapped"])
async def test_consume_acks_300_jobs_each_delivered_once(
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
    runtime: Runtime,
    official_client: ClientProcess,
) -> None:
    await make_bridge("hybrid")
    names = [f"j{n}" for n in range(300)]
    await publish_http(client, names)
    await official_client.call("connect", servers=hub.url)
    await official_client.call("consumer", stream="orders", name="workers")
    consumed = await official_client.call(
        "consume", count=300, max_messages=100, ack=True, within=60
    )
    await official_client.call("flush")
    assert sorted(m["data"] for m in consumed) == sorted(names)
    assert all(m["info"]["deliveryCount"] == 1 for m in consumed)

    async def all_delivered() -> bool:
        async with runtime.db.transaction() as tx:
            rows = await tx.conn.execute(
                text("SELECT status, attempt, count(*) FROM job GROUP BY status, attempt")
            )
            return {(s, a): n for s, a, n in rows.all()} == {("DELIVERED", 1): 300}

    await eventually(all_delivered, timeout=10)
