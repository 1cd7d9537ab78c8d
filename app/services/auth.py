"""Token checks shared by every use case, in the order the Go original answers them."""

from __future__ import annotations

import hmac

from app.domain.errors import Forbidden, NotFound, PreconditionFailed, Unauthenticated
from app.domain.models import Consumer, ConsumerType
from app.store.db import Tx
from app.store.stakeholders import channel_and_producer_tokens, consumer_with_channel_token


def tokens_match(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


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
    found = await consumer_with_channel_token(tx, channel_id, consumer_id)
    if found is None:
        raise NotFound(f"channel {channel_id!r} not found")
    expected_channel_token, consumer = found
    if not tokens_match(channel_token, expected_channel_token):
        raise Forbidden("channel token does not match")
    if consumer is None:
        raise Unauthenticated(f"consumer {consumer_id!r} does not exist in this channel")
    if not tokens_match(consumer_token, consumer.token):
        raise Forbidden("consumer token does not match")
    if require_pull and consumer.type is not ConsumerType.PULL:
        raise PreconditionFailed(f"consumer {consumer_id!r} is a push consumer")
    return consumer


async def publishing_producer(
    tx: Tx,
    channel_id: str,
    channel_token: str | None,
    producer_id: str | None,
    producer_token: str | None,
) -> str:
    """404 channel, 403 channel token, 401 unknown producer, 403 producer token; one query."""
    found = await channel_and_producer_tokens(tx, channel_id, producer_id or "")
    if found is None:
        raise NotFound(f"channel {channel_id!r} not found")
    expected_channel_token, expected_producer_token = found
    if not tokens_match(channel_token, expected_channel_token):
        raise Forbidden("channel token does not match")
    if not producer_id or expected_producer_token is None:
        raise Unauthenticated(f"producer {producer_id!r} does not exist")
    if not tokens_match(producer_token, expected_producer_token):
        raise Forbidden("producer token does not match")
    return producer_id
