"""Raw pull requests and acks, byte for byte against real JetStream: every status line, its
description and `Nats-Pending-*` headers, heartbeats, round-robin among waiting requests,
`no_wait` endings, max_bytes endings and `+NXT`. Then the API errors."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import APIError, NotFoundError, ServiceUnavailableError

from app.bridge import protocol as p
from app.runtime import Runtime
from app.store.jobs import JobStore
from tests.bridge.conftest import BridgeFactory, arriving, publish_http, uncapped_only
from tests.helpers.jetstream import until_consumer
from tests.helpers.natsproc import NatsServer
from tests.helpers.side_by_side import (
    Publish,
    http_publisher,
    on_jetstream,
    reference,
    with_msg_id,
)

NEXT = "$JS.API.CONSUMER.MSG.NEXT.orders.workers"


def summarize(msg: Msg, *, pending_bytes: bool) -> tuple[Any, ...]:
    headers = msg.headers or {}
    status = headers.get("Status")
    if status is None:
        return ("msg", msg.data.decode())
    extra: tuple[Any, ...] = ()
    if "Nats-Pending-Messages" in headers:
        extra = (headers["Nats-Pending-Messages"],)
        if pending_bytes:
            extra += (headers.get("Nats-Pending-Bytes"),)
    return ("status", status, headers.get("Description"), *extra)


async def collect(
    nc: Client,
    body: bytes,
    window: float,
    *,
    pending_bytes: bool = True,
    during: Callable[[], Awaitable[None]] | None = None,
) -> list[tuple[Any, ...]]:
    """Send one pull request from a fresh inbox and record what arrives within `window` of
    its first answer (every case here gets one, on both servers)."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish(NEXT, body, reply=inbox)
    if during is not None:
        await during()
    seen: list[tuple[Any, ...]] = []
    async for msg in arriving(sub, window, first_within=10):
        seen.append(summarize(msg, pending_bytes=pending_bytes))
        if msg.reply:
            await nc.publish(msg.reply, b"")  # ack deliveries so the next case starts clean
    await sub.unsubscribe()
    return seen


async def wire_scenario(url: str, publish: Publish) -> dict[str, Any]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    out: dict[str, Any] = {}
    try:
        out["bad_json"] = await collect(nc, b"{bad", 0.3)
        out["heartbeat_too_large"] = await collect(
            nc, b'{"batch": 1, "expires": 1000000000, "idle_heartbeat": 600000000}', 0.3
        )
        out["heartbeat_without_expires"] = await collect(nc, b'{"idle_heartbeat": 1000}', 0.3)
        out["wrong_type"] = await collect(nc, b'{"batch": "2"}', 0.3)
        out["batch_limit"] = await collect(nc, b'{"batch": 300}', 0.3)
        out["expires_limit"] = await collect(nc, b'{"batch": 1, "expires": 301000000000}', 0.3)
        out["no_wait_empty"] = await collect(nc, b'{"batch": 1, "no_wait": true}', 0.3)
        out["expired"] = await collect(nc, b'{"batch": 2, "expires": 300000000}', 0.6)
        out["expired_bytes"] = await collect(
            nc, b'{"batch": 2, "expires": 300000000, "max_bytes": 1000}', 0.6
        )
        out["no_wait_with_expires"] = await collect(
            nc, b'{"batch": 1, "no_wait": true, "expires": 300000000}', 0.6
        )
        out["heartbeats"] = await collect(
            nc, b'{"batch": 1, "expires": 1200000000, "idle_heartbeat": 500000000}', 1.5
        )
        await publish(["w1"])
        # (JetStream takes in a new message asynchronously: a no_wait pull sent in the same
        # instant as the publish can still see an empty stream.)
        await until_consumer(js, "orders", "workers", num_pending=1)
        out["drained_no_wait"] = await collect(nc, b'{"batch": 3, "no_wait": true}', 0.3)
        await publish(["w2"])
        await until_consumer(js, "orders", "workers", num_pending=1)
        out["too_big"] = await collect(
            nc, b'{"batch": 1, "max_bytes": 10, "expires": 400000000}', 0.6
        )
        out["batch_completed"] = await collect(
            nc,
            b'{"batch": 1, "max_bytes": 100000, "expires": 400000000}',
            0.6,
            pending_bytes=False,
        )

        async def later() -> None:
            await until_consumer(js, "orders", "workers", num_waiting=1)
            await publish(["w3"])

        out["empty_body_waits"] = await collect(nc, b"", 1.0, during=later)
        out["integer_body"] = await collect(nc, b"2 ", 0.5, during=lambda: publish(["w4", "w5"]))

        # Round-robin: two waiting requests, then three messages.
        a, b = nc.new_inbox(), nc.new_inbox()
        sub_a, sub_b = await nc.subscribe(a), await nc.subscribe(b)
        await nc.publish(NEXT, b'{"batch": 2, "expires": 1500000000}', reply=a)
        await nc.publish(NEXT, b'{"batch": 2, "expires": 1500000000}', reply=b)
        await nc.flush()
        await until_consumer(js, "orders", "workers", num_waiting=2)
        await publish(["r1", "r2", "r3"])
        for name, sub in (("round_robin_a", sub_a), ("round_robin_b", sub_b)):
            got: list[tuple[Any, ...]] = []
            # Each request to its end (its batch filled, or its status at the 1.5 s expiry),
            # then anything that would follow it.
            while len(got) < 2 and not any(line[0] == "status" for line in got):
                msg = await sub.next_msg(timeout=10)
                got.append(summarize(msg, pending_bytes=True))
                if msg.reply:
                    await nc.publish(msg.reply, b"")
            with contextlib.suppress(NatsTimeoutError):
                while True:
                    msg = await sub.next_msg(timeout=0.05)
                    got.append(summarize(msg, pending_bytes=True))
                    if msg.reply:
                        await nc.publish(msg.reply, b"")
            out[name] = got
            await sub.unsubscribe()

        # +NXT: ack the first, and the ack's reply gets the next message.
        await publish(["n1", "n2"])
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.publish(NEXT, b'{"batch": 1, "expires": 1000000000}', reply=inbox)
        first = await sub.next_msg(timeout=2)
        # (Not nc.request(): the server writes the stored subject on the delivery, which
        # nats-py's request multiplexer cannot route; a plain inbox subscription gets it.)
        await nc.publish(first.reply, b'+NXT {"batch": 1}', reply=inbox)
        following = await sub.next_msg(timeout=2)
        out["next"] = [first.data.decode(), following.data.decode()]
        out["next_delivered"] = following.reply.split(".")[-5]
        out["ack_sync_of_next"] = (await nc.request(following.reply, b"+ACK", timeout=2)).data
        # A repeated ack with a reply is still answered (the server does so).
        out["ack_again"] = (await nc.request(following.reply, b"+ACK", timeout=2)).data
        await sub.unsubscribe()
    finally:
        await nc.close()
    return out


@pytest.mark.parametrize("mode", ["client", "hybrid"])
async def test_wire_matches_jetstream(
    cap: str,
    mode: str,
    jetstream_server: NatsServer,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
    runtime: Runtime,
) -> None:
    # One reference serves both variants of the broker's consumer: the scenario never has
    # more than three jobs outstanding, so max_ack_pending (1000 here, no limit when
    # uncapped) never binds, and it reads no consumer info.
    expected = await reference(
        jetstream_server, wire_scenario, max_ack_pending=1000, headers=with_msg_id
    )
    # The reference is what the protocol document recorded; a scenario that observes nothing
    # cannot pass.
    assert expected["bad_json"] == [
        (
            "status",
            "400",
            "Bad Request - invalid character 'b' looking for beginning of object key string",
        )
    ]
    assert expected["expired"] == [("status", "408", "Request Timeout", "2", "0")]
    assert expected["heartbeats"] == [
        ("status", "100", "Idle Heartbeat"),
        ("status", "100", "Idle Heartbeat"),
        ("status", "408", "Request Timeout", "1", "0"),
    ]
    assert expected["round_robin_a"] == [("msg", "r1"), ("msg", "r3")]
    await make_bridge(mode)
    actual = await wire_scenario(hub.url, http_publisher(client))
    for key, value in expected.items():
        assert actual[key] == value, key
    assert actual.keys() == expected.keys()
    # The too-big job was given back without a retry counted, then delivered once.
    async with runtime.db.transaction() as tx:
        w2 = await JobStore(tx).get(2)
    assert w2 is not None and w2.status.value == "DELIVERED" and w2.attempt == 1
    assert w2.retry_count == 0


async def api_errors(url: str) -> dict[str, Any]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    out: dict[str, Any] = {}
    try:
        for label, subject in (
            ("info_unknown_consumer", "$JS.API.CONSUMER.INFO.orders.nobody"),
            ("info_unknown_stream", "$JS.API.CONSUMER.INFO.nostream.workers"),
        ):
            reply = json.loads((await nc.request(subject, b"", timeout=2)).data)
            out[label] = (reply["type"], reply["error"])
        with pytest.raises(NotFoundError) as caught:
            await js.consumer_info("orders", "nobody")
        out["consumer_info_error"] = (caught.value.code, caught.value.err_code)
        names = json.loads(
            (await nc.request("$JS.API.STREAM.NAMES", b'{"subject": "orders"}', timeout=2)).data
        )
        out["names"] = (names["type"], names["streams"], names["total"])
        psub = await js.pull_subscribe_bind("nobody", stream="orders")
        with pytest.raises(ServiceUnavailableError):
            await psub.fetch(1, timeout=1)
        out["fetch_unknown"] = "ServiceUnavailableError"
    finally:
        await nc.close()
    return out


@uncapped_only
async def test_api_errors_match_jetstream(
    jetstream_server: NatsServer, hub: NatsServer, make_bridge: BridgeFactory
) -> None:
    async with on_jetstream(jetstream_server, workers=False) as side:
        expected = await api_errors(side.url)
    assert expected["info_unknown_consumer"][1] == {
        "code": 404,
        "err_code": 10014,
        "description": "consumer not found",
    }
    await make_bridge("client")
    actual = await api_errors(hub.url)
    assert actual["names"][1:] == expected["names"][1:] == (["orders"], 1)
    assert actual == expected


async def account_info(url: str) -> dict[str, Any]:
    """`$JS.API.INFO` twice (the second sees the first in its API totals), and what nats-py's
    account_info() makes of it."""
    nc = await nats.connect(url)
    try:
        await nc.request("$JS.API.INFO", b"", timeout=5)
        raw: dict[str, Any] = json.loads((await nc.request("$JS.API.INFO", b"", timeout=5)).data)
        info = await nc.jetstream().account_info()
    finally:
        await nc.close()
    assert info.limits is not None and info.api is not None
    assert (info.streams, info.consumers) == (raw["streams"], raw["consumers"])
    return raw


@pytest.mark.parametrize("mode", ["client", "hybrid"])
@uncapped_only
async def test_account_info_is_shaped_as_jetstream(
    mode: str, jetstream_server: NatsServer, hub: NatsServer, make_bridge: BridgeFactory
) -> None:
    """Clients ask `$JS.API.INFO` before anything else (the JavaScript client's
    jetstreamManager fails without an answer): the bridge answers it as the server does, with
    channels as streams and pull consumers as consumers."""
    expected = await account_info(jetstream_server.url)
    await make_bridge(mode)
    actual = await account_info(hub.url)
    assert actual.keys() == expected.keys()
    assert actual["limits"] == expected["limits"]
    assert actual["type"] == expected["type"] == "io.nats.jetstream.api.v1.account_info_response"
    assert actual["api"]["level"] == expected["api"]["level"]
    assert actual["api"]["total"] == 2 and actual["api"]["errors"] == 0  # this bridge's own
    # The seed: channels orders and hooks; one pull consumer (workers) and one push (mailer).
    assert (actual["streams"], actual["consumers"]) == (2, 1)


async def stream_info(url: str, stream: str, body: bytes = b"") -> dict[str, Any]:
    nc = await nats.connect(url)
    try:
        reply = await nc.request(f"$JS.API.STREAM.INFO.{stream}", body, timeout=5)
    finally:
        await nc.close()
    document: dict[str, Any] = json.loads(reply.data)
    return document


@pytest.mark.parametrize("mode", ["client", "hybrid"])
@uncapped_only
async def test_stream_info_is_shaped_as_jetstream(
    mode: str,
    jetstream_server: NatsServer,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
) -> None:
    """`$JS.API.STREAM.INFO` (nats-jetstream's get_consumer asks it before CONSUMER.INFO): the
    channel as a stream of its own subject, its messages counted; errors as the server's."""
    async with on_jetstream(jetstream_server, headers=with_msg_id) as side:
        await side.publish(["a", "b"])
        expected = await stream_info(side.url, "orders")
        missing = await stream_info(side.url, "nope")
        garbage = await stream_info(side.url, "orders", b"{x")
    await make_bridge(mode)
    await publish_http(client, ["a", "b"])
    actual = await stream_info(hub.url, "orders")
    assert actual.keys() == expected.keys() - {"cluster"}  # no cluster leader: not clustered
    server_only = {"metadata", "allow_msg_ttl"}  # what 2.15 adds of its own version and flags
    assert {k: v for k, v in expected["config"].items() if k not in server_only} == {
        k: v for k, v in actual["config"].items() if k not in server_only
    }
    assert actual["state"].keys() == expected["state"].keys()
    for key in ("messages", "first_seq", "last_seq", "num_subjects", "consumer_count"):
        assert actual["state"][key] == expected["state"][key], key
    assert await stream_info(hub.url, "nope") == missing
    assert (await stream_info(hub.url, "orders", b"{x"))["error"]["err_code"] == garbage["error"][
        "err_code"
    ]


@uncapped_only
async def test_create_and_push_consumers(hub: NatsServer, make_bridge: BridgeFactory) -> None:
    await make_bridge("client")
    nc = await nats.connect(hub.url)
    js = nc.jetstream()
    try:
        # CREATE of an existing pull consumer with the config it has answers with its info.
        info = await nc.request("$JS.API.CONSUMER.INFO.orders.workers", b"", timeout=2)
        same = json.dumps({"stream_name": "orders", "config": json.loads(info.data)["config"]})
        created = json.loads(
            (
                await nc.request(
                    "$JS.API.CONSUMER.CREATE.orders.workers.orders", same.encode(), timeout=2
                )
            ).data
        )
        assert created["type"] == p.CREATE_TYPE
        assert (created["name"], created["stream_name"]) == ("workers", "orders")
        legacy = json.loads(
            (
                await nc.request(
                    "$JS.API.CONSUMER.DURABLE.CREATE.orders.workers", same.encode(), timeout=2
                )
            ).data
        )
        assert legacy["name"] == "workers"
        # pull_subscribe of an unknown durable creates it (consumer management over NATS).
        await js.pull_subscribe("orders", durable="newcomer", stream="orders")
        with pytest.raises(NotFoundError):
            await js.pull_subscribe("nothing", durable="workers")
        # A push consumer: the JSON APIs refuse it, and a pull gets `409 Consumer is push based`.
        with pytest.raises(APIError) as push:
            await js.consumer_info("hooks", "mailer")
        assert push.value.code == 409
        assert "push based" in str(push.value.description)
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.publish("$JS.API.CONSUMER.MSG.NEXT.hooks.mailer", b"", reply=inbox)
        status = await sub.next_msg(timeout=2)
        assert status.headers is not None
        assert (status.headers["Status"], status.headers["Description"]) == (
            "409",
            "Consumer is push based",
        )
    finally:
        await nc.close()


@uncapped_only
async def test_max_waiting_and_api_prefix(
    hub: NatsServer, make_bridge: BridgeFactory, runtime: Runtime
) -> None:
    """A bridge on another API prefix (for accounts with JetStream) and a full wait queue."""
    await make_bridge("client", api_prefix="BRIDGE.API", ack_prefix="BRIDGE.ACK")
    nc = await nats.connect(hub.url)
    try:
        js = nc.jetstream(prefix="BRIDGE.API")
        psub = await js.pull_subscribe("orders", durable="workers")
        with pytest.raises(NatsTimeoutError):
            await psub.fetch(1, timeout=0.5)
        # That request counts in the wait queue until it expires.
        await until_consumer(js, "orders", "workers", num_waiting=0)
        # Fill the wait queue of `workers` (max-waiting 512) and see the 513th refused.
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        for _ in range(512):
            await nc.publish(
                "BRIDGE.API.CONSUMER.MSG.NEXT.orders.workers",
                b'{"batch": 1, "expires": 3000000000}',
                reply=inbox,
            )
        await nc.flush()
        refused = nc.new_inbox()
        refused_sub = await nc.subscribe(refused)
        await until_consumer(js, "orders", "workers", num_waiting=512)
        await nc.publish(
            "BRIDGE.API.CONSUMER.MSG.NEXT.orders.workers",
            b'{"batch": 1, "expires": 3000000000}',
            reply=refused,
        )
        status = await refused_sub.next_msg(timeout=2)
        assert status.headers is not None
        assert (status.headers["Status"], status.headers["Description"]) == (
            "409",
            "Exceeded MaxWaiting",
        )
        info = await psub.consumer_info()
        assert info.num_waiting == 512
        await sub.unsubscribe()
    finally:
        await nc.close()


async def deleted_while_waiting(url: str, delete: Callable[[], Awaitable[object]]) -> Any:
    nc = await nats.connect(url)
    try:

        async def then_delete() -> None:
            await until_consumer(nc.jetstream(), "orders", "workers", num_waiting=1)
            await delete()

        return await collect(nc, b'{"batch": 2, "expires": 4000000000}', 3.0, during=then_delete)
    finally:
        await nc.close()


@uncapped_only
async def test_consumer_deleted_while_requests_wait(
    jetstream_server: NatsServer,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
) -> None:
    async with on_jetstream(jetstream_server, workers=False) as side:
        js = side.nc.jetstream()
        await js.add_consumer("orders", durable_name="workers", ack_policy="explicit")
        expected = await deleted_while_waiting(
            side.url, lambda: js.delete_consumer("orders", "workers")
        )
    assert expected == [("status", "409", "Consumer Deleted")]

    await make_bridge("hybrid")

    async def delete_over_http() -> None:
        found = await client.get("/channel/orders/consumer/workers")
        since = found.headers["Last-Modified"]
        response = await client.delete(
            "/channel/orders/consumer/workers", headers={"If-Unmodified-Since": since}
        )
        assert response.status_code == 204, response.text

    actual = await deleted_while_waiting(hub.url, delete_over_http)
    assert actual == expected
