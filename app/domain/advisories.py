"""JetStream consumer advisories the broker publishes (ADR-42 and nats-server's shapes):
their subjects, types and fields. Pure: the publishing is the NATS transport's."""

from __future__ import annotations

from typing import NamedTuple

from app.domain.models import Consumer

PREFIX = "$JS.EVENT.ADVISORY.CONSUMER"
PINNED = "io.nats.jetstream.advisory.v1.consumer_group_pinned"
UNPINNED = "io.nats.jetstream.advisory.v1.consumer_group_unpinned"
MAX_DELIVER = "io.nats.jetstream.advisory.v1.max_deliver"


class Advisory(NamedTuple):
    subject: str
    type: str
    fields: dict[str, object]


def pinned(consumer: Consumer, pin_id: str) -> Advisory:
    return Advisory(
        f"{PREFIX}.PINNED.{consumer.channel_id}.{consumer.id}",
        PINNED,
        {
            "stream": consumer.channel_id,
            "consumer": consumer.id,
            "group": consumer.priority.group,
            "pinned_id": pin_id,
        },
    )


def unpinned(channel_id: str, consumer_id: str, group: str, reason: str) -> Advisory:
    """`reason`: "admin" (an unpin) or "timeout" (the pinned client stopped pulling)."""
    return Advisory(
        f"{PREFIX}.UNPINNED.{channel_id}.{consumer_id}",
        UNPINNED,
        {"stream": channel_id, "consumer": consumer_id, "group": group, "reason": reason},
    )


def max_deliveries(channel_id: str, consumer_id: str, stream_seq: int, deliveries: int) -> Advisory:
    """A job dead-lettered because its last retry was used up."""
    return Advisory(
        f"{PREFIX}.MAX_DELIVERIES.{channel_id}.{consumer_id}",
        MAX_DELIVER,
        {
            "stream": channel_id,
            "consumer": consumer_id,
            "stream_seq": stream_seq,
            "deliveries": deliveries,
        },
    )
