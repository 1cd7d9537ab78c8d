"""Consumer management with the two official clients besides nats-py (@nats-io/jetstream's
jetstreamManager, and nats-jetstream): the same script against real JetStream and the bridge,
the same answers: create, info, list, update (allowed, and refused as nats-server refuses it),
delete of a durable."""

from __future__ import annotations

from typing import Any

import pytest

from app.bridge import protocol as p
from tests.bridge.conftest import BridgeFactory, uncapped_only
from tests.helpers.js_clients import DRIVERS, ClientProcess, install
from tests.helpers.natsproc import NatsServer
from tests.helpers.side_by_side import reference

CONFIG: dict[str, Any] = {
    "durable_name": "mgr",
    "description": "made over NATS",
    "ack_policy": "explicit",
    "ack_wait": 5 * p.NANOS,
    "max_deliver": 3,
    "max_ack_pending": 10,
    "filter_subject": "orders",
}


def failure_seen(answer: dict[str, Any]) -> Any:
    """A failure as compared: its status code (the clients word their errors themselves)."""
    failed = answer.get("failed")
    return None if failed is None else ("failed", failed.get("code"), failed.get("err_code"))


async def script(kind: str, url: str) -> dict[str, Any]:
    client = await ClientProcess.spawn(DRIVERS[kind])
    r: dict[str, Any] = {}
    try:
        await client.answer("connect", servers=url)
        r["add"] = await client.answer("add", stream="orders", config=CONFIG)
        r["info"] = await client.answer("info", stream="orders", name="mgr")
        r["list"] = await client.answer("list", stream="orders")
        changed = {**CONFIG, "ack_wait": 7 * p.NANOS, "description": "changed"}
        r["update"] = await client.answer("update", stream="orders", name="mgr", config=changed)
        refused = {**changed, "max_waiting": 7}
        r["update_refused"] = failure_seen(
            await client.answer("update", stream="orders", name="mgr", config=refused)
        )
        r["delete"] = await client.answer("delete", stream="orders", name="mgr")
        r["info_after"] = failure_seen(await client.answer("info", stream="orders", name="mgr"))
        r["list_after"] = await client.answer("list", stream="orders")
        await client.answer("close")
    finally:
        await client.close()
    return r


@pytest.fixture(params=list(DRIVERS))
def kind(request: pytest.FixtureRequest) -> str:
    install()
    return str(request.param)


@uncapped_only
async def test_the_client_manages_bridge_consumers_as_jetstream_ones(
    jetstream_server: NatsServer, hub: NatsServer, make_bridge: BridgeFactory, kind: str
) -> None:
    expected = await reference(jetstream_server, script, kind, publishes=False)
    assert expected["add"]["ok"]["config"]["ack_wait"] == 5 * p.NANOS, expected
    assert expected["update"]["ok"]["config"]["description"] == "changed", expected
    assert expected["list"]["ok"] == ["mgr", "workers"], expected
    assert expected["info_after"] is not None and expected["update_refused"] is not None
    await make_bridge("hybrid")
    actual = await script(kind, hub.url)
    assert actual == expected
