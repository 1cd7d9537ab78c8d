"""Token checks shared by every use case, in the order the Go original answers them."""

from __future__ import annotations

import hmac

from app.domain.errors import Forbidden, NotFound, PreconditionFailed, Unauthenticated
from app.domain.models import Consumer, ConsumerType, Stakeholder
from app.store.db import Tx
from app.store.stakeholders import ConsumerStore, channels, producers


def tokens_match(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


async def channel_with_token(tx: Tx, channel_id: str, token: str | None) -> Stakeholder:
    """404 unknown channel, then 403 wrong channel token."""
    channel = await channels(tx).get(channel_id)
    if channel is None:
        raise NotFound(f"channel {channel_id!r} not found")
    if not tokens_match(token, channel.token):
        raise Forbidden("channel token does not match")
    return channel


async def producer_with_token(tx: Tx, producer_id: str | None, token: str | None) -> Stakeholder:
    """401 unknown producer, then 403 wrong producer token."""
    producer = await producers(tx).get(producer_id) if producer_id else None
    if producer is None:
        raise Unauthenticated(f"producer {producer_id!r} does not exist")
    if not tokens_match(token, producer.token):
        raise Forbidden("producer token does not match")
    return producer


async def pull_consumer(
    tx: Tx,
    channel_id: str,
    channel_token: str | None,
    consumer_id: str,
    consumer_token: str | None,
    *,
    require_pull: bool = True,
) -> Consumer:
    """404 channel, 403 channel token, 401 unknown consumer, 403 consumer token, 412 push.

    Job reads and the dead-letter queue serve push consumers too (require_pull=False).
    """
    await channel_with_token(tx, channel_id, channel_token)
    consumer = await ConsumerStore(tx).get(channel_id, consumer_id)
    if consumer is None:
        raise Unauthenticated(f"consumer {consumer_id!r} does not exist in this channel")
    if not tokens_match(consumer_token, consumer.token):
        raise Forbidden("consumer token does not match")
    if require_pull and consumer.type is not ConsumerType.PULL:
        raise PreconditionFailed(f"consumer {consumer_id!r} is a push consumer")
    return consumer
