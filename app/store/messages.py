"""Messages: the insert that fans a message out to one job per consumer, and message reads."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Row, func, insert, literal, select
from sqlalchemy.exc import IntegrityError

from app.domain.errors import Conflict, InvalidInput
from app.domain.models import Message, Page
from app.store.db import MAX_NOTIFY_PAYLOAD, NOTIFY_CHANNEL, Database, Tx, now
from app.store.pagination import Cursor, decode_int_cursor, page_bounds, paginate
from app.store.schema import consumer, job, message


def message_from_row(row: Row[Any]) -> Message:
    return message_from_mapping(row._mapping)


def message_from_mapping(row: Mapping[Any, Any]) -> Message:
    headers = row["headers"]
    if isinstance(headers, str):
        headers = json.loads(headers)
    return Message(
        pk=row["pk"],
        channel_id=row["channel_id"],
        message_id=row["message_id"],
        producer_id=row["producer_id"],
        payload=bytes(row["payload"]),
        content_type=row["content_type"],
        priority=row["priority"],
        headers=dict(headers or {}),
        received_at=row["received_at"],
    )


# A publish on PostgreSQL as one statement (autocommit: one round trip): credentials, the
# message, one QUEUED job per consumer of the channel, and the NOTIFY that wakes their
# waiters. No row back means bad credentials or a repeated message id: the caller then takes
# the full transaction, which says which. Tokens are compared after the rows are found by key.
PUBLISH_WITH_CREDENTIALS = f"""
WITH allowed AS (
    SELECT channel.id FROM channel JOIN producer ON producer.id = %(producer_id)s
    WHERE channel.id = %(channel_id)s AND channel.token = %(channel_token)s
      AND producer.token = %(producer_token)s
), stored AS (
    INSERT INTO message (channel_id, message_id, producer_id, payload, content_type, priority,
                         headers, received_at)
    SELECT allowed.id, %(message_id)s, %(producer_id)s, %(payload)s, %(content_type)s,
           %(priority)s, %(headers)s::json, now()
    FROM allowed
    ON CONFLICT (channel_id, message_id) DO NOTHING
    RETURNING pk, received_at
), fanned AS (
    INSERT INTO job (message_pk, consumer_pk, status, priority, payload_size,
                     earliest_next_attempt_at, status_changed_at, created_at)
    SELECT stored.pk, consumer.pk, 'QUEUED', %(priority)s, %(payload_size)s,
           stored.received_at, stored.received_at, stored.received_at
    FROM stored JOIN consumer ON consumer.channel_id = %(channel_id)s
    RETURNING consumer_pk
), told AS (
    SELECT pg_notify('{NOTIFY_CHANNEL}',
                     CASE WHEN length(pks) <= {MAX_NOTIFY_PAYLOAD} THEN pks ELSE '*' END)
    FROM (SELECT string_agg(CAST(consumer_pk AS text), ',') AS pks FROM fanned) AS listed
    WHERE pks IS NOT NULL
)
SELECT stored.pk, stored.received_at, ARRAY(SELECT consumer_pk FROM fanned),
       (SELECT count(*) FROM told)
FROM stored
"""


async def publish_with_credentials(
    db: Database,
    *,
    channel_id: str,
    channel_token: str,
    producer_id: str,
    producer_token: str,
    message_id: str,
    payload: bytes,
    content_type: str,
    priority: int,
    headers: dict[str, str],
) -> tuple[Message, list[int]] | None:
    """PostgreSQL only: the message and the consumers that got a job, or None (see above)."""
    rows = await db.run_alone(
        PUBLISH_WITH_CREDENTIALS,
        {
            "channel_id": channel_id,
            "channel_token": channel_token,
            "producer_id": producer_id,
            "producer_token": producer_token,
            "message_id": message_id,
            "payload": payload,
            "payload_size": len(payload),
            "content_type": content_type,
            "priority": priority,
            "headers": json.dumps(headers),
        },
    )
    if not rows:
        return None
    row = rows[0]
    stored = Message(
        pk=row[0],
        channel_id=channel_id,
        message_id=message_id,
        producer_id=producer_id,
        payload=payload,
        content_type=content_type,
        priority=priority,
        headers=headers,
        received_at=row[1],
    )
    return stored, list(row[2])


class MessageStore:
    def __init__(self, tx: Tx) -> None:
        self._tx = tx

    async def publish(
        self,
        *,
        channel_id: str,
        message_id: str,
        producer_id: str,
        payload: bytes,
        content_type: str,
        priority: int,
        headers: dict[str, str],
    ) -> tuple[Message, list[int]]:
        """Store the message and one QUEUED job per consumer of the channel.

        Returns the message and the consumers that got a job. A repeated message id raises
        Conflict; the caller's transaction then rolls back, so nothing is half written.
        """
        db_now = now(self._tx.dialect)
        try:
            row = (
                await self._tx.conn.execute(
                    insert(message)
                    .values(
                        channel_id=channel_id,
                        message_id=message_id,
                        producer_id=producer_id,
                        payload=payload,
                        content_type=content_type,
                        priority=priority,
                        headers=headers,
                        received_at=db_now,
                    )
                    .returning(*message.c)
                )
            ).one()
        except IntegrityError:
            raise Conflict(
                f"message {message_id!r} already exists in channel {channel_id!r}"
            ) from None
        stored = message_from_row(row)
        fan_out = (
            insert(job)
            .from_select(
                [
                    "message_pk",
                    "consumer_pk",
                    "status",
                    "priority",
                    "payload_size",
                    "earliest_next_attempt_at",
                    "status_changed_at",
                    "created_at",
                ],
                select(
                    literal(stored.pk),
                    consumer.c.pk,
                    literal("QUEUED"),
                    literal(priority),
                    literal(len(payload)),
                    db_now,
                    db_now,
                    db_now,
                ).where(consumer.c.channel_id == channel_id),
            )
            .returning(job.c.consumer_pk)
        )
        consumer_pks = list((await self._tx.conn.execute(fan_out)).scalars())
        return stored, consumer_pks

    async def get(self, channel_id: str, message_id: str) -> Message | None:
        query = select(message).where(
            message.c.channel_id == channel_id, message.c.message_id == message_id
        )
        row = (await self._tx.conn.execute(query)).first()
        return message_from_row(row) if row else None

    async def list(self, channel_id: str, cursor: Cursor, limit: int) -> Page[Message]:
        for given in (cursor.next, cursor.previous):
            # Drivers refuse integers beyond BIGINT (a 500); a forged cursor is a 400.
            if given is not None and not 0 <= decode_int_cursor(given) < 2**63:
                raise InvalidInput("malformed pagination cursor")
        base = select(message).where(message.c.channel_id == channel_id)
        rows = (
            await self._tx.conn.execute(paginate(base, message.c.pk, cursor, limit, True))
        ).all()
        items, next_cursor, previous_cursor = page_bounds(rows, cursor, limit, "pk")
        return Page([message_from_row(row) for row in items], next_cursor, previous_cursor)

    async def job_counts(self, channel_id: str) -> dict[str, int]:
        """Jobs of the channel's messages by status."""
        query = (
            select(job.c.status, func.count())
            .select_from(job.join(message, job.c.message_pk == message.c.pk))
            .where(message.c.channel_id == channel_id)
            .group_by(job.c.status)
        )
        return {status: int(count) for status, count in await self._tx.conn.execute(query)}
