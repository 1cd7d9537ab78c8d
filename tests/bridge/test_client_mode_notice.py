"""Client mode says at start, once, what its clients see differently: a delivery's
`msg.subject` is the requester's inbox and which clients need hybrid mode; hybrid mode says
nothing of it, and a reconnection does not repeat it."""

from __future__ import annotations

import logging

import pytest

from app.bridge.bridge import CLIENT_MODE_NOTICE
from tests.bridge.conftest import BridgeFactory, uncapped_only
from tests.helpers.natsproc import NatsServer
from tests.helpers.waiting import eventually


def notices(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "app.bridge.bridge"
        and r.msg == CLIENT_MODE_NOTICE
        and isinstance(r.args, tuple)
        and r.args[0] == name
    ]


@uncapped_only
async def test_client_mode_says_once_which_clients_need_hybrid(
    make_bridge: BridgeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    server = NatsServer()
    server.start()
    try:
        bridge = await make_bridge("client", server=server)
        [line] = notices(caplog, bridge.name)
        assert "msg.subject is the requester's inbox" in line
        assert "under $WB.ACK" in line and "mode=hybrid" in line
        assert "@nats-io/jetstream" in line and "nats-jetstream" in line
        # Losing and regaining the server is no new start.
        server.stop()
        await eventually(lambda: not bridge.nc.is_connected, what="the connection lost")
        server.start()
        await eventually(lambda: bridge.nc.is_connected, timeout=30, what="reconnected")
        assert len(notices(caplog, bridge.name)) == 1
    finally:
        server.cleanup()


@uncapped_only
async def test_hybrid_mode_has_no_notice(
    make_bridge: BridgeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    bridge = await make_bridge("hybrid")
    assert notices(caplog, bridge.name) == []
    assert any(r.getMessage().startswith(f"NATS bridge {bridge.name} up") for r in caplog.records)
