"""Ephemeral consumers, inactive thresholds and AckNone over NATS: the same script of raw
JetStream API requests (nats-py) against real nats-server 2.15 JetStream and the bridge, the
same answers from both. An ephemeral made without a name is named by the server and goes
away after its inactive threshold (5 s when it sets none); so does a durable that sets one;
a pull request waiting keeps a consumer; an AckNone consumer's deliveries are settled as they
are sent."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import httpx
import nats
from sqlalchemy import text

from app.bridge import protocol as p
from app.runtime import Runtime
from tests.bridge.conftest import BridgeFactory, publish_http, uncapped_only
from tests.helpers.consumer_management import config_seen, create_body, request
from tests.helpers.natsproc import NatsServer
from tests.helpers.side_by_side import Publish, http_publisher, reference
from tests.helpers.waiting import eventually

NANOS = p.NANOS
THRESHOLD = 1 * NANOS
# Beside COMPARED (test_consumer_management): what these consumers set.
SEEN = ("inactive_threshold", "ack_policy", "ack_wait", "max_ack_pending", "durable_name")

# The bridge reports a channel's one subject as every consumer's filter: set it, as
# test_consumer_management does.
ALL = {"filter_subject": "orders"}


def seen(document: dict[str, Any]) -> dict[str, Any]:
    config = document.get("config") or {}
    return config_seen(document) | {k: config.get(k) for k in SEEN} | {"name": None}


async def gone(nc: Any, name: str) -> Any:
    """The error CONSUMER.INFO answers once the consumer is gone."""

    async def error() -> Any:
        answer = await request(nc, f"CONSUMER.INFO.orders.{name}")
        return answer.get("error")

    return await eventually(error, timeout=20)


async def ephemeral_script(url: str, publish: Publish) -> dict[str, Any]:
    nc = await nats.connect(url)
    r: dict[str, Any] = {}
    try:
        js = nc.jetstream()
        unnamed = await request(
            nc,
            "CONSUMER.CREATE.orders",
            create_body({"ack_policy": "explicit", "inactive_threshold": THRESHOLD, **ALL}),
        )
        r["unnamed"] = seen(unnamed)
        r["unnamed_name_length"] = len(unnamed["name"])
        default = await request(
            nc, "CONSUMER.CREATE.orders", create_body({"ack_policy": "explicit", **ALL})
        )
        r["default_threshold"] = seen(default)
        named = await request(
            nc,
            "CONSUMER.CREATE.orders.eph",
            create_body(
                {
                    "name": "eph",
                    "ack_policy": "none",
                    "inactive_threshold": THRESHOLD,
                    "deliver_policy": "new",
                    **ALL,
                }
            ),
        )
        r["named_ack_none"] = seen(named)
        durable = await request(
            nc,
            "CONSUMER.CREATE.orders.dur",
            create_body(
                {
                    "durable_name": "dur",
                    "ack_policy": "explicit",
                    "inactive_threshold": THRESHOLD,
                    "deliver_policy": "new",
                    **ALL,
                }
            ),
        )
        r["durable"] = seen(durable)
        r["ephemeral_with_durable_name"] = (
            await request(
                nc,
                "CONSUMER.CREATE.orders",
                create_body({"durable_name": "x", "ack_policy": "explicit"}),
            )
        ).get("error")
        # AckNone: a delivery needs no ack and is not pending.
        await publish(["a1", "a2"])
        sub = await js.pull_subscribe_bind("eph", "orders")
        msgs = await sub.fetch(2, timeout=5)
        r["ack_none_got"] = [m.data for m in msgs]

        async def settled() -> Any:
            info = await request(nc, "CONSUMER.INFO.orders.eph")
            return info if info["num_ack_pending"] == 0 else None

        info = await eventually(settled, timeout=10)
        r["ack_none_info"] = (
            info["num_ack_pending"],
            info["num_pending"],
            info["delivered"]["consumer_seq"],
            info["ack_floor"]["consumer_seq"],
        )

        # A pull request waiting on `kept` (4 s, nothing to deliver) keeps it past its 1 s
        # threshold.
        kept = await request(
            nc,
            "CONSUMER.CREATE.orders.kept",
            create_body(
                {
                    "name": "kept",
                    "ack_policy": "explicit",
                    "inactive_threshold": THRESHOLD,
                    "deliver_policy": "new",
                    **ALL,
                }
            ),
        )
        assert "error" not in kept, kept
        kept_sub = await js.pull_subscribe_bind("kept", "orders")
        waiting = asyncio.ensure_future(kept_sub.fetch(1, timeout=4))
        await asyncio.sleep(0)  # the request goes out
        started = time.monotonic()
        r["unnamed_gone"] = await gone(nc, unnamed["name"])
        r["default_alive"] = "error" not in await request(
            nc, f"CONSUMER.INFO.orders.{default['name']}"
        )
        r["named_gone"] = await gone(nc, "eph")
        r["durable_gone"] = await gone(nc, "dur")
        r["kept_while_waiting"] = "error" not in await request(nc, "CONSUMER.INFO.orders.kept")
        r["gone_within"] = time.monotonic() - started
        with contextlib.suppress(nats.errors.TimeoutError):
            await waiting
        r["kept_gone_after_wait"] = await gone(nc, "kept")
        r["default_gone"] = await gone(nc, default["name"])
        r["names_after"] = (await request(nc, "CONSUMER.NAMES.orders"))["consumers"]
    finally:
        await nc.close()
    return r


@uncapped_only
async def test_ephemerals_and_inactive_thresholds_as_jetstream(
    jetstream_server: NatsServer,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
) -> None:
    expected = await reference(jetstream_server, ephemeral_script)
    # The reference itself, so that a broken script cannot pass by matching nothing.
    assert expected["unnamed"]["inactive_threshold"] == THRESHOLD
    assert expected["unnamed"]["durable_name"] is None
    assert expected["default_threshold"]["inactive_threshold"] == 5 * NANOS
    assert expected["named_ack_none"]["ack_policy"] == "none"
    assert expected["ack_none_got"] == [b"a1", b"a2"]
    assert expected["unnamed_gone"]["err_code"] == 10014
    assert expected["kept_while_waiting"] is True
    assert expected["default_alive"] is True

    await make_bridge("hybrid")  # msg.metadata
    actual = await ephemeral_script(hub.url, http_publisher(client))
    # Both let a 1 s threshold (nats-server adds up to 1 s of jitter) run out in seconds.
    assert expected["gone_within"] < 6 and actual["gone_within"] < 6, actual["gone_within"]
    for key in ("gone_within",):
        expected.pop(key, None)
        actual.pop(key)
    for key, value in expected.items():
        assert actual[key] == value, key
    assert actual.keys() == expected.keys()


@uncapped_only
async def test_an_inactive_consumer_goes_with_its_jobs(
    hub: NatsServer, make_bridge: BridgeFactory, client: httpx.AsyncClient, runtime: Runtime
) -> None:
    """Deleted by the sweeper through the management API's delete: its jobs go with it."""
    await make_bridge("client")
    nc = await nats.connect(hub.url)
    try:
        created = await request(
            nc,
            "CONSUMER.CREATE.orders.short",
            create_body(
                {
                    "name": "short",
                    "ack_policy": "explicit",
                    "inactive_threshold": THRESHOLD,
                    "deliver_policy": "new",
                    **ALL,
                }
            ),
        )
        assert "error" not in created, created
        await publish_http(client, ["j1", "j2"])
        await gone(nc, "short")
        assert (await client.get("/channel/orders/consumer/short")).status_code == 404
        async with runtime.db.transaction() as tx:
            rows = await tx.conn.execute(
                text("SELECT count(*) FROM job WHERE consumer_pk NOT IN (SELECT pk FROM consumer)")
            )
            assert rows.scalar_one() == 0
    finally:
        await nc.close()
