"""Token checks shared by every use case, in the order the Go original answers them."""

from __future__ import annotations

from app.domain.errors import Forbidden, NotFound, PreconditionFailed, Unauthenticated
from app.domain.models import Consumer, ConsumerType
from app.domain.pulls import ConsumerCredentials
from app.store.db import Tx
from app.store.stakeholders import check_consumer_tokens, check_producer_tokens


async def pull_consumer(
    tx: Tx, creds: ConsumerCredentials, *, require_pull: bool = True
) -> Consumer:
    """404 channel, 403 channel token, 401 unknown consumer, 403 consumer token, 412 push.

    Job reads and the dead-letter queue serve push consumers too (require_pull=False). An
    operator (the admin token) passes the token checks.
    """
    channel_id, consumer_id = creds.channel_id, creds.consumer_id
    found = await check_consumer_tokens(
        tx, channel_id, creds.channel_token, consumer_id, creds.consumer_token
    )
    if found is None:
        raise NotFound(f"channel {channel_id!r} not found")
    if not (found.channel_token_ok or creds.operator):
        raise Forbidden("channel token does not match")
    consumer = found.consumer
    if consumer is None:
        raise Unauthenticated(f"consumer {consumer_id!r} does not exist in this channel")
    if not (found.consumer_token_ok or creds.operator):
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
    found = await check_producer_tokens(
        tx, channel_id, channel_token, producer_id or "", producer_token
    )
    if found is None:
        raise NotFound(f"channel {channel_id!r} not found")
    if not found.channel_token_ok:
        raise Forbidden("channel token does not match")
    if not producer_id or not found.producer_found:
        raise Unauthenticated(f"producer {producer_id!r} does not exist")
    if not found.producer_token_ok:
        raise Forbidden("producer token does not match")
    return producer_id
