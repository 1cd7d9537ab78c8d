"""A consumer's own max_waiting: the same script against real nats-server 2.15 JetStream and
the bridge. A consumer created over NATS with max_waiting 2 holds two waiting pull requests;
the third is answered `409 Exceeded MaxWaiting` (a request with a heartbeat is dropped
silently instead, as nats-server drops it), and once one of the two ends, a new one waits
again. A consumer made over HTTP has no max_waiting of its own: `[pull] max-waiting` holds."""

from __future__ import annotations

import json
from typing import Any

import nats
from nats.errors import TimeoutError as NatsTimeoutError

from tests.bridge.conftest import BridgeFactory, uncapped_only
from tests.helpers.consumer_management import create_body, request
from tests.helpers.natsproc import NatsServer
from tests.helpers.side_by_side import reference
from tests.helpers.waiting import eventually

NEXT = "$JS.API.CONSUMER.MSG.NEXT.orders.lim"
LIMITED = {"durable_name": "lim", "ack_policy": "explicit", "max_waiting": 2}


def status_of(msg: Any) -> tuple[str | None, str | None]:
    headers = msg.headers or {}
    return headers.get("Status"), headers.get("Description")


async def max_waiting_script(url: str) -> dict[str, Any]:
    nc = await nats.connect(url)
    r: dict[str, Any] = {}
    try:
        created = await request(nc, "CONSUMER.CREATE.orders.lim", create_body(LIMITED))
        r["config_max_waiting"] = created["config"]["max_waiting"]

        async def pull(body: dict[str, Any]) -> Any:
            inbox = nc.new_inbox()
            sub = await nc.subscribe(inbox)
            await nc.publish(NEXT, json.dumps(body).encode(), reply=inbox)
            await nc.flush()
            return sub

        async def waiting(n: int) -> bool:
            info = await request(nc, "CONSUMER.INFO.orders.lim")
            return bool(info["num_waiting"] == n)

        short = await pull({"batch": 1, "expires": 1_500_000_000})
        await pull({"batch": 1, "expires": 20_000_000_000})
        await eventually(lambda: waiting(2), what="two requests waiting")
        third = await pull({"batch": 1, "expires": 20_000_000_000})
        r["third"] = status_of(await third.next_msg(timeout=5))
        beating = await pull({"batch": 1, "expires": 20_000_000_000, "idle_heartbeat": 10**9})
        # The first request's 408 comes after 1.5 s: by then a refusal of this one would be
        # in, and nats-server sends none.
        r["short_ended"] = status_of(await short.next_msg(timeout=5))
        try:
            r["heartbeat_request"] = status_of(await beating.next_msg(timeout=0.2))
        except NatsTimeoutError:
            r["heartbeat_request"] = "dropped"
        # A place is free again: a new request waits.
        await eventually(lambda: waiting(1), what="the short request gone")
        await pull({"batch": 1, "expires": 20_000_000_000})
        await eventually(lambda: waiting(2), what="a new request waiting")
        r["waiting_again"] = 2
    finally:
        await nc.close()
    return r


@uncapped_only
async def test_a_consumers_own_max_waiting_as_jetstream(
    jetstream_server: NatsServer, hub: NatsServer, make_bridge: BridgeFactory
) -> None:
    expected = await reference(jetstream_server, max_waiting_script, publishes=False)
    assert expected["config_max_waiting"] == 2
    assert expected["third"] == ("409", "Exceeded MaxWaiting")
    assert expected["short_ended"] == ("408", "Request Timeout")
    assert expected["heartbeat_request"] == "dropped"
    await make_bridge("client")
    assert await max_waiting_script(hub.url) == expected


@uncapped_only
async def test_a_consumer_made_over_http_has_the_process_limit(
    hub: NatsServer, make_bridge: BridgeFactory
) -> None:
    """`workers` (seeded over HTTP config) has no max_waiting: [pull] max-waiting applies."""
    bridge = await make_bridge("client")
    consumer = (await bridge.cache.get("orders", "workers")).consumer
    assert consumer is not None and consumer.options.max_waiting is None
    scheduler = bridge.runtime.scheduler
    assert scheduler.max_waiting_of(consumer) == scheduler.max_waiting
