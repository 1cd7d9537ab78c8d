"""The bridge's NATS client hands the messages of its direct subscriptions (acks and pull
requests) straight from nats-py's parser to a plain function: on a real nats-server, a handler
that raises costs only its own message, other subscriptions go through nats-py as before, and
an unsubscribed direct subscription hears nothing more. The ack queue behind it is bounded."""

from __future__ import annotations

import logging
from typing import Any

import nats
import pytest

from app.bridge import acks
from app.bridge.acks import AckProcessor, InboundAck
from app.bridge.client import DirectClient
from app.bridge.protocol import AckToken, parse_ack
from tests.helpers.natsproc import NatsServer
from tests.helpers.waiting import eventually


async def test_a_direct_handler_gets_each_message_and_a_failing_one_costs_only_itself(
    hub: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    heard: list[tuple[str, str | None, bytes]] = []
    by_callback: list[bytes] = []

    def handler(subject: str, reply: str | None, payload: bytes) -> None:
        if payload == b"boom":
            raise ValueError("a handler's own failure")
        heard.append((subject, reply, payload))

    async def callback(msg: Any) -> None:
        by_callback.append(msg.data)

    nc = DirectClient()
    await nc.connect(hub.url)
    sender = await nats.connect(hub.url)
    try:
        direct = await nc.subscribe_direct("direct.>", "", handler)
        await nc.subscribe("plain", cb=callback)
        await nc.flush()
        await sender.publish("direct.a", b"one", reply="inbox.1")
        await sender.publish("direct.b", b"boom")
        await sender.publish("direct.c", b"three")
        await sender.publish("plain", b"through nats-py")
        await sender.flush()
        # direct.c and the plain message came after the failing one: the read loop went on.
        await eventually(lambda: len(heard) == 2 and by_callback == [b"through nats-py"])
        assert heard == [("direct.a", "inbox.1", b"one"), ("direct.c", None, b"three")]
        assert any("direct.b" in r.getMessage() for r in caplog.records if r.levelname == "ERROR")

        await direct.unsubscribe()
        # What the server sent before it took the UNSUB in reaches the client after it:
        # such a message, handed over as the parser would, goes nowhere.
        await nc._process_msg(direct._id, b"direct.d", b"", b"late", b"")
        await sender.publish("plain", b"still heard")
        await sender.flush()
        await eventually(lambda: len(by_callback) == 2)
        assert [payload for _, _, payload in heard] == [b"one", b"three"]
    finally:
        await sender.close()
        await nc.close()


def _ack(job_id: int, *, sent: bool = False) -> InboundAck:
    token = AckToken("orders", "workers", 1, job_id, job_id, 0, 0, job_id)
    return InboundAck(token, parse_ack(b"+ACK"), None, sent=sent)


async def test_acks_beyond_the_bound_are_dropped_and_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    monkeypatch.setattr(acks, "MAX_QUEUED_ACKS", 3)
    # submit() touches nothing but its queue; the rest is never reached here.
    processor = AckProcessor(None, None, None, None, None)  # type: ignore[arg-type]
    for job_id in range(1, 7):
        processor.submit(_ack(job_id))
    processor.submit(_ack(7, sent=True))  # the bridge's own settles are never dropped
    queued = [a.token.job_id for a in processor._queue]
    assert queued == [1, 2, 3, 7]
    dropped = [r for r in caplog.records if "dropping" in r.getMessage()]
    assert len(dropped) == 1
    # Acks being applied count as held: with two in the statement, one more fits.
    processor._queue.clear()
    processor._applying = 2
    processor.submit(_ack(8))
    processor.submit(_ack(9))
    assert [a.token.job_id for a in processor._queue] == [8]
    dropping = [r for r in caplog.records if "dropping" in r.getMessage()]
    assert len(dropping) == 2  # a second time the bound was reached, said again
