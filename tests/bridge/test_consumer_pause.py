"""Pausing a consumer over NATS (nats-server 2.11+'s CONSUMER.PAUSE and a new consumer's
pause_until): the same script of raw JetStream API requests against real nats-server and
against the bridge, the same answers: a paused consumer's pull gets nothing while its messages
are kept, the resume hands them out; a consumer created paused; the errors. Then the broker's
side: the pause seen over HTTP."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import nats

from app.domain.nats_pauses import PAUSE_TYPE
from tests.bridge.conftest import BridgeFactory, uncapped_only
from tests.helpers.natsproc import NatsServer
from tests.helpers.side_by_side import Publish, http_publisher, on_jetstream

API = "$JS.API"
# Whole seconds: the broker keeps microseconds, nats-server nanoseconds.
LATER = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)
LATER_TEXT = LATER.strftime("%Y-%m-%dT%H:%M:%SZ")


async def request(nc: Any, subject: str, body: dict[str, Any] | bytes | None = None) -> Any:
    payload = body if isinstance(body, bytes) else json.dumps(body).encode() if body else b""
    reply = await nc.request(f"{API}.{subject}", payload, timeout=5)
    return json.loads(reply.data)


def error_code(document: dict[str, Any]) -> Any:
    return (document.get("error") or {}).get("err_code")


def paused_seen(document: dict[str, Any]) -> tuple[Any, ...]:
    """What both answer alike (pause_remaining is checked for its size)."""
    remaining = document.get("pause_remaining", 0)
    # LATER is fixed when the module is imported, which may be minutes before this runs.
    left = (LATER - datetime.now(UTC)).total_seconds() * 10**9
    near = abs(remaining - left) < 120 * 10**9 if remaining else remaining
    return (document.get("type"), document.get("paused"), document.get("pause_until"), near)


async def pause_script(url: str, publish: Publish) -> dict[str, Any]:
    nc = await nats.connect(url)
    r: dict[str, Any] = {}
    try:
        js = nc.jetstream()
        created = await request(
            nc,
            "CONSUMER.CREATE.orders.pz.orders",
            {
                "stream_name": "orders",
                "config": {
                    "durable_name": "pz",
                    "ack_policy": "explicit",
                    "deliver_policy": "new",
                    "filter_subject": "orders",
                },
            },
        )
        assert "error" not in created, created
        r["pause"] = paused_seen(
            await request(nc, "CONSUMER.PAUSE.orders.pz", {"pause_until": LATER_TEXT})
        )
        info = await request(nc, "CONSUMER.INFO.orders.pz")
        r["info_paused"] = (info["config"].get("pause_until"), paused_seen(info)[1:])
        await publish(["held"])
        sub = await js.pull_subscribe_bind("pz", "orders")
        try:
            got = await sub.fetch(1, timeout=1.5)
            r["fetched_while_paused"] = [m.data for m in got]
        except (TimeoutError, nats.errors.TimeoutError):
            r["fetched_while_paused"] = []
        r["pending_while_paused"] = (await request(nc, "CONSUMER.INFO.orders.pz"))["num_pending"]
        r["resume"] = paused_seen(await request(nc, "CONSUMER.PAUSE.orders.pz", b""))
        info = await request(nc, "CONSUMER.INFO.orders.pz")
        r["info_resumed"] = ("pause_until" in info["config"], info.get("paused"))
        [message] = await sub.fetch(1, timeout=5)
        r["fetched_after"] = message.data
        await message.ack_sync()
        # A consumer created paused.
        held = await request(
            nc,
            "CONSUMER.CREATE.orders.born.orders",
            {
                "stream_name": "orders",
                "config": {
                    "durable_name": "born",
                    "ack_policy": "explicit",
                    "deliver_policy": "new",
                    "filter_subject": "orders",
                    "pause_until": LATER_TEXT,
                },
            },
        )
        r["created_paused"] = (held["config"].get("pause_until"), held.get("paused"))
        r["errors"] = [
            error_code(await request(nc, "CONSUMER.PAUSE.orders.nobody", {})),
            error_code(await request(nc, "CONSUMER.PAUSE.nowhere.pz", {})),
            error_code(await request(nc, "CONSUMER.PAUSE.orders.pz", b"{x")),
            error_code(await request(nc, "CONSUMER.PAUSE.orders.pz", {"pause_until": "tomorrow"})),
        ]
        for name in ("pz", "born"):
            await request(nc, f"CONSUMER.DELETE.orders.{name}")
    finally:
        await nc.close()
    return r


@uncapped_only
async def test_pause_answers_as_jetstream(
    jetstream_server: NatsServer,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
) -> None:
    async with on_jetstream(jetstream_server) as side:
        expected = await pause_script(side.url, side.publish)
    # The reference itself, so that a broken script cannot pass by matching nothing.
    assert expected["pause"] == (PAUSE_TYPE, True, LATER_TEXT, True)
    assert expected["fetched_while_paused"] == [] and expected["fetched_after"] == b"held"
    assert expected["resume"] == (PAUSE_TYPE, False, "0001-01-01T00:00:00Z", 0)
    assert expected["created_paused"] == (LATER_TEXT, True)

    await make_bridge("hybrid")
    actual = await pause_script(hub.url, http_publisher(client))
    for key, value in expected.items():
        assert actual[key] == value, (key, actual[key], value)


@uncapped_only
async def test_a_pause_over_nats_is_the_consumers_pause_over_http(
    hub: NatsServer, make_bridge: BridgeFactory, client: httpx.AsyncClient
) -> None:
    await make_bridge("client")
    nc = await nats.connect(hub.url)
    try:
        answer = await request(nc, "CONSUMER.PAUSE.orders.workers", {"pause_until": LATER_TEXT})
        assert answer["paused"] is True, answer
        body = (await client.get("/channel/orders/consumer/workers")).json()
        assert body["Paused"] is True
        assert datetime.fromisoformat(body["PausedUntil"]) == LATER
        assert (await client.delete("/channel/orders/consumer/workers/pause")).status_code == 200
        info = await request(nc, "CONSUMER.INFO.orders.workers")
        assert "paused" not in info and "pause_until" not in info["config"], info
    finally:
        await nc.close()
