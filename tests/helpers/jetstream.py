"""Waiting for a JetStream consumer's state through its CONSUMER.INFO, the same request on real
JetStream and on the bridge: the comparison scenarios wait for the state the next step needs
(messages taken in, a pull request waiting, acks applied) on both sides alike."""

from __future__ import annotations

from typing import Any

from nats.js import JetStreamContext
from nats.js.api import ConsumerInfo

from tests.helpers.waiting import eventually


def settled(info: ConsumerInfo) -> bool:
    """Nothing delivered waits for its ack, and the ack floor has caught up with the
    deliveries (JetStream applies acks and terms after it answered them)."""
    delivered, floor = info.delivered, info.ack_floor
    return (
        info.num_ack_pending == 0
        and delivered is not None
        and floor is not None
        and floor.stream_seq == delivered.stream_seq
    )


async def until_consumer(
    js: JetStreamContext,
    stream: str,
    consumer: str,
    *,
    within: float = 10.0,
    acks_settled: bool = False,
    **want: Any,
) -> ConsumerInfo:
    """Until the consumer's info shows each field of `want` (num_pending=4, num_waiting=1),
    and, with `acks_settled`, no ack outstanding (`settled`)."""

    async def reached() -> ConsumerInfo:
        info: ConsumerInfo = await js.consumer_info(stream, consumer)
        seen = {key: getattr(info, key) for key in want}
        assert seen == want, seen
        assert not acks_settled or settled(info), (info.num_ack_pending, info.ack_floor)
        return info

    return await eventually(reached, within, 0.02, what=f"{stream}/{consumer} showing {want}")
