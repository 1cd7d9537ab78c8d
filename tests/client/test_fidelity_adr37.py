"""consume() against ADR-37 (the simplified consumer API): max_messages and max_bytes are
exclusive, its defaults, and a heartbeat error ends the consume."""

from __future__ import annotations

import asyncio

import pytest
from webhook_broker_client import HeartbeatError
from webhook_broker_client.consume import ConsumeOptions

from tests.helpers.processes import Setup
from tests.helpers.waiting import eventually


def test_max_messages_and_max_bytes_are_exclusive() -> None:
    with pytest.raises(ValueError, match="exclusive"):
        ConsumeOptions(max_messages=10, max_bytes=1000)
    assert ConsumeOptions(max_bytes=1000).max_messages is None


async def test_consume_refuses_both_limits(setup: Setup) -> None:
    with pytest.raises(ValueError, match="exclusive"):
        setup.consumer.consume(lambda job: None, max_messages=10, max_bytes=1000)


def test_the_defaults_are_the_adrs() -> None:
    options = ConsumeOptions()
    assert (options.message_limit, options.max_bytes) == (1000, None)
    assert (options.expires, options.heartbeat) == (60.0, 30.0)
    assert options.message_threshold == 250
    assert options.stop_on_heartbeat_error


async def test_a_heartbeat_error_ends_consume_by_default(private_setup: Setup) -> None:
    setup = private_setup
    heartbeat = 0.5
    context = setup.consumer.consume(lambda job: None, expires=5, idle_heartbeat=heartbeat)
    kept: list[Exception] = []
    keeping = setup.consumer.consume(
        lambda job: None,
        expires=5,
        idle_heartbeat=heartbeat,
        stop_on_heartbeat_error=False,
        error_callback=kept.append,
    )
    await eventually(
        lambda: context.heartbeats and keeping.heartbeats, 15, what="both pulls open, beating"
    )
    setup.process.pause()
    try:
        with pytest.raises(HeartbeatError):
            await asyncio.wait_for(context.wait(), 15)
        assert context.closed
        await eventually(
            lambda: any(isinstance(e, HeartbeatError) for e in kept), 15, what="a heartbeat error"
        )
        assert not keeping.closed  # told, and still pulling
    finally:
        setup.process.resume()
        await keeping.stop()
