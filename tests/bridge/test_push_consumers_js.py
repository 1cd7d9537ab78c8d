"""Push consumers with the official JavaScript client, @nats-io/jetstream 3.4
(tests/js/push.mjs): `jsm.consumers.add` with a deliver subject, then
`js.consumers.getPushConsumer(...).consume()`, acking each message; a durable (with idle
heartbeats and flow control) and a deliver group whose two members split the jobs. The same
script against real nats-server 2.15 JetStream and the bridge in hybrid mode, the same answers.

Hybrid only: the client takes a message whose subject is the deliver subject for a status (as
it does for a pull's inbox), and only a leafnode link can give a delivery the stored subject
(the client table in docs/guides/nats-bridge.md)."""

from __future__ import annotations

import contextlib
from typing import Any

import httpx

from app.bridge import protocol as p
from tests.bridge.conftest import BridgeFactory, uncapped_only
from tests.helpers.js_clients import JS_DIR, ClientProcess, install
from tests.helpers.natsproc import NatsServer
from tests.helpers.side_by_side import Publish, http_publisher, reference
from tests.helpers.waiting import eventually


async def push_driver(url: str) -> ClientProcess:
    driver = await ClientProcess.spawn(["node", str(JS_DIR / "push.mjs")])
    assert await driver.answer("connect", servers=url) == {"ok": True}
    return driver


async def finish(driver: ClientProcess) -> None:
    """Close the client's connection first: an open one keeps node running past stdin's end."""
    with contextlib.suppress(Exception):
        await driver.answer("close")
    await driver.close()


async def received(driver: ClientProcess) -> list[dict[str, Any]]:
    answer: list[dict[str, Any]] = (await driver.answer("received"))["ok"]
    return answer


async def durable_script(url: str, publish: Publish) -> dict[str, Any]:
    driver = await push_driver(url)
    r: dict[str, Any] = {}
    try:
        config = {
            "durable_name": "jp",
            "deliver_subject": "push.jp",
            "ack_policy": "explicit",
            "idle_heartbeat": p.NANOS,
            "flow_control": True,
            "filter_subject": "orders",
        }
        r["created"] = await driver.answer("add", stream="orders", config=config)
        r["consume"] = await driver.answer("consume", stream="orders", name="jp")
        names = [f"j{i}" for i in range(5)]
        await publish(names)

        async def all_received() -> list[dict[str, Any]] | None:
            got = await received(driver)
            return got if len(got) >= len(names) else None

        r["received"] = await eventually(all_received, timeout=20, what="5 deliveries")

        async def settled() -> Any:
            info = (await driver.answer("info", stream="orders", name="jp"))["ok"]
            return info if info["num_ack_pending"] == 0 else None

        r["settled"] = await eventually(settled, timeout=10, what="every delivery acked")

        async def beating() -> bool:
            notices = (await driver.answer("notices"))["ok"]
            return bool(notices.get("heartbeat"))

        r["heartbeat"] = await eventually(beating, timeout=10, what="an idle heartbeat")
        await driver.answer("stop")
    finally:
        await finish(driver)
    return r


async def group_script(url: str, publish: Publish) -> dict[str, Any]:
    first, second = await push_driver(url), await push_driver(url)
    r: dict[str, Any] = {}
    try:
        config = {
            "durable_name": "jg",
            "deliver_subject": "push.jg",
            "deliver_group": "jg",
            "ack_policy": "explicit",
            "filter_subject": "orders",
        }
        r["created"] = await first.answer("add", stream="orders", config=config)
        r["consume"] = [
            await member.answer("consume", stream="orders", name="jg") for member in (first, second)
        ]
        names = [f"g{i:02d}" for i in range(30)]
        await publish(names)

        async def all_received() -> tuple[list[Any], list[Any]] | None:
            a, b = await received(first), await received(second)
            return (a, b) if len(a) + len(b) >= len(names) else None

        a, b = await eventually(all_received, timeout=20, what="30 deliveries")
        r["all_once"] = sorted(m["data"] for m in a + b) == names
        r["both_members"] = bool(a) and bool(b)
        r["subjects"] = sorted({m["subject"] for m in a + b})
    finally:
        await finish(first)
        await finish(second)
    return r


@uncapped_only
async def test_a_js_push_durable(
    jetstream_server: NatsServer,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
) -> None:
    install()
    expected = await reference(jetstream_server, durable_script)
    assert [m["data"] for m in expected["received"]] == [f"j{i}" for i in range(5)]
    assert expected["consume"] == {"ok": True} and expected["heartbeat"] is True
    await make_bridge("hybrid")
    assert await durable_script(hub.url, http_publisher(client)) == expected


@uncapped_only
async def test_a_js_push_deliver_group_splits_the_jobs(
    jetstream_server: NatsServer,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
) -> None:
    install()
    expected = await reference(jetstream_server, group_script)
    assert expected["all_once"] and expected["both_members"]
    assert expected["subjects"] == ["orders"]
    await make_bridge("hybrid")
    assert await group_script(hub.url, http_publisher(client)) == expected
