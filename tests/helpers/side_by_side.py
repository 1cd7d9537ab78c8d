"""Side by side: one client script run against real nats-server JetStream (the reference) and
against the bridge, the answers compared. A script is `script(url, publish)`: it connects to
`url` as a client would and calls `publish` to put messages on the channel `orders`, which
puts them on the stream over NATS on the reference and over the broker's HTTP API on the
bridge. The reference side runs once per session for each script (and arguments), on a fresh
stream `orders` holding the pull consumer `workers` as the bridge tests seed it; the bridge
side is the bridge tests' own fixtures (`make_bridge`, `hub`, `client`)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import nats
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import NotFoundError
from sqlalchemy import text

from app.bridge import protocol as p
from app.runtime import Runtime
from tests.helpers.natsproc import NatsServer

T = TypeVar("T")

# What the bridge tests seed consumer `workers` with (tests/bridge/conftest.py), and so what its
# reference twin on real JetStream gets: the ack wait in seconds, and the broker's retries (a
# delivery plus MAX_RETRY redeliveries: JetStream's max_deliver is one more).
ACK_WAIT = 2
MAX_RETRY = 4
# JetStream's "no limit" for max_ack_pending, also what the bridge reports for an uncapped
# consumer.
UNLIMITED = -1

# Message names (str: the payload and the message id) or raw payloads (bytes).
Publish = Callable[[Sequence[str] | Sequence[bytes]], Awaitable[None]]
# The headers a reference publish gives a named message.
Headers = Callable[[str], dict[str, str]]

# The seeded channel's and producer's tokens (tests/bridge/conftest.py).
PRODUCER_HEADERS = {
    "X-Broker-Channel-Token": "orders-token",
    "X-Broker-Producer-ID": "shop",
    "X-Broker-Producer-Token": "shop-token",
}
PUBLISH_HEADERS = {
    **PRODUCER_HEADERS,
    "Content-Type": "text/plain",
    "X-Broker-Metadata-Headers": "X-Order",
}


def as_http(name: str) -> dict[str, str]:
    """What a message `publish_http` sends carries to a NATS client through the bridge: its
    content type, its metadata header, and its id as the de-duplication id."""
    return {"Content-Type": "text/plain", "X-Order": name, "Nats-Msg-Id": name}


def with_msg_id(name: str) -> dict[str, str]:
    return {"Nats-Msg-Id": name}


async def publish_http(client: httpx.AsyncClient, names: Sequence[str]) -> None:
    """Publish messages `names` over the broker's HTTP API (message id = payload = name)."""
    for name in names:
        response = await client.post(
            "/channel/orders/broadcast",
            content=name.encode(),
            headers={**PUBLISH_HEADERS, "X-Broker-Message-ID": name, "X-Order": name},
        )
        assert response.status_code == 201, response.text


async def publish_http_at_once(
    client: httpx.AsyncClient, names: Sequence[str], at_once: int = 16
) -> None:
    """`publish_http`, `at_once` requests in flight: for thousands of messages, whose order on
    the bridge's stream is then their message ids' (`stream_order`), not `names`'."""
    gate = asyncio.Semaphore(at_once)

    async def one(name: str) -> None:
        async with gate:
            await publish_http(client, [name])

    await asyncio.gather(*(one(name) for name in names))


async def stream_order(runtime: Runtime) -> list[str]:
    """The message ids of channel `orders` in the order the bridge's stream holds them."""
    async with runtime.db.transaction() as tx:
        rows = await tx.conn.execute(
            text("SELECT message_id FROM message WHERE channel_id = 'orders' ORDER BY pk")
        )
        return [str(v) for v in rows.scalars()]


def in_stream_order(got: Sequence[Sequence[Any]], order: Sequence[str]) -> tuple[bool, bool, int]:
    """Of (data, stream sequence) pairs a client read: (every message once in the stream's
    order, sequences rising, how many)."""
    seqs = [seq for _, seq in got]
    return [data for data, _ in got] == list(order), seqs == sorted(set(seqs)), len(got)


def http_publisher(client: httpx.AsyncClient) -> Publish:
    """The bridge side's `publish`: names as `publish_http` sends them; raw payloads as
    application/octet-stream with the ids big-0, big-1, ..."""

    async def publish(items: Sequence[str] | Sequence[bytes]) -> None:
        names = [item for item in items if isinstance(item, str)]
        if len(names) == len(items):
            await publish_http(client, names)
            return
        for index, item in enumerate(items):
            assert isinstance(item, bytes), "names and payloads are published apart"
            response = await client.post(
                "/channel/orders/broadcast",
                content=item,
                headers={
                    **PRODUCER_HEADERS,
                    "Content-Type": "application/octet-stream",
                    "X-Broker-Message-ID": f"big-{index}",
                },
            )
            assert response.status_code == 201, response.text

    return publish


async def fresh_stream(nc: Client) -> None:
    """Stream `orders` (subject `orders`) on real JetStream, empty, whatever ran before."""
    js = nc.jetstream()
    with contextlib.suppress(NotFoundError):
        await js.delete_stream("orders")
    await js.add_stream(name="orders", subjects=["orders"])


async def reference_consumer(nc: Client, *, ack_wait: int, max_ack_pending: int) -> None:
    """Stream `orders` and pull consumer `workers` on real JetStream, configured as the bridge
    reports its consumer, limits included (created with a raw API request: nats-py's
    ConsumerConfig has no max_batch / max_expires)."""
    await fresh_stream(nc)
    config = {
        "durable_name": "workers",
        "name": "workers",
        "ack_policy": "explicit",
        "ack_wait": ack_wait * p.NANOS,
        "max_deliver": MAX_RETRY + 1,
        "max_ack_pending": max_ack_pending,
        "max_waiting": 512,
        "max_batch": 256,
        "max_expires": 300 * p.NANOS,
        "filter_subject": "orders",
    }
    created = await nc.request(
        "$JS.API.CONSUMER.CREATE.orders.workers.orders",
        json.dumps({"stream_name": "orders", "config": config}).encode(),
        timeout=5,
    )
    assert "error" not in json.loads(created.data), created.data


async def add_workers(nc: Client, *, max_ack_pending: int, **more: Any) -> None:
    """Pull consumer `workers` on the stream made with nats-py's add_consumer, as a client
    would make it: the seed's ack wait and max deliver, and `more` of ConsumerConfig's fields
    (none of the bridge's process limits unless given)."""
    await nc.jetstream().add_consumer(
        "orders",
        ConsumerConfig(
            durable_name="workers",
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=ACK_WAIT,
            max_deliver=MAX_RETRY + 1,
            max_ack_pending=max_ack_pending,
            **more,
        ),
    )


@dataclass
class JetStreamSide:
    """The reference while a script runs: its URL, a connection of the harness's own, and the
    `publish` that puts messages on the stream over NATS."""

    url: str
    nc: Client
    publish: Publish


@contextlib.asynccontextmanager
async def on_jetstream(
    server: NatsServer,
    *,
    workers: bool = True,
    ack_wait: int = ACK_WAIT,
    max_ack_pending: int = UNLIMITED,
    headers: Headers | None = None,
) -> AsyncIterator[JetStreamSide]:
    """A fresh stream `orders` on the reference server, with `workers` (as reference_consumer
    makes it) unless `workers=False`; deleted again afterwards, so that the next script meets
    no consumer of this one's making. Names are published with `headers(name)`, if given."""
    nc = await nats.connect(server.url)
    js = nc.jetstream()
    try:
        if workers:
            await reference_consumer(nc, ack_wait=ack_wait, max_ack_pending=max_ack_pending)
        else:
            await fresh_stream(nc)

        async def publish(items: Sequence[str] | Sequence[bytes]) -> None:
            for item in items:
                if isinstance(item, bytes):
                    await js.publish("orders", item)
                else:
                    with_headers = None if headers is None else headers(item)
                    await js.publish("orders", item.encode(), headers=with_headers)

        yield JetStreamSide(server.url, nc, publish)
    finally:
        with contextlib.suppress(NotFoundError):
            await js.delete_stream("orders")
        await nc.close()


_answers: dict[Hashable, Any] = {}


async def reference(
    server: NatsServer,
    script: Callable[..., Awaitable[T]],
    *args: Hashable,
    publishes: bool = True,
    workers: bool = True,
    ack_wait: int = ACK_WAIT,
    max_ack_pending: int = UNLIMITED,
    headers: Headers | None = None,
) -> T:
    """`script(*args, url, publish)` (`script(*args, url)` with `publishes=False`) against real
    JetStream, inside `on_jetstream` with the options given: run once per session for each
    script and `args`, every later call answered from that run. A shallow copy each time, so
    that a test that takes keys out of its expectations leaves the next one's whole."""
    key = (script, *args)
    if key not in _answers:
        async with on_jetstream(
            server,
            workers=workers,
            ack_wait=ack_wait,
            max_ack_pending=max_ack_pending,
            headers=headers,
        ) as side:
            tail = (side.url, side.publish) if publishes else (side.url,)
            _answers[key] = await script(*args, *tail)
    answer: T = copy.copy(_answers[key])
    return answer
