"""Messages: the insert that fans a message out to one job per consumer, and message reads."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Insert, Row, Select, and_, delete, func, insert, literal, or_, select
from sqlalchemy.exc import IntegrityError

from app.domain.errors import Conflict, InvalidInput
from app.domain.models import Cursor, Message, Page
from app.store.db import Tx, now
from app.store.ledger import LedgerStore
from app.store.pagination import decode_int_cursor, page_bounds, paginate
from app.store.partitions import ATTACHED, MIN_ID
from app.store.schema import consumer, job, message, message_key, message_partition
from app.store.types import Timestamp


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
        scheduled_for=row.get("scheduled_for"),
    )


# A new job's columns as every insert of QUEUED jobs fills them.
QUEUED_JOB_COLUMNS = (
    "message_pk",
    "consumer_pk",
    "status",
    "priority",
    "payload_size",
    "earliest_next_attempt_at",
    "status_changed_at",
    "created_at",
)


def insert_queued_jobs(picked: Select[Any]) -> Insert:
    """QUEUED jobs from `picked`'s rows, in QUEUED_JOB_COLUMNS' order (a publish's fan-out and
    a consumer's history copied, app/store/backfill.py)."""
    return insert(job).from_select(QUEUED_JOB_COLUMNS, picked)


def pk_of(channel_id: str, message_id: str) -> Any:
    """The message's pk by its id: found in message_key first, so that the read of message
    that follows reaches one partition (pruned when it runs)."""
    return (
        select(message_key.c.message_pk)
        .where(message_key.c.channel_id == channel_id, message_key.c.message_id == message_id)
        .scalar_subquery()
    )


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
        scheduled_for: datetime | None = None,
    ) -> tuple[Message, list[int]]:
        """Store the message and one QUEUED job per consumer of the channel.

        Returns the message and the consumers that got a job. A repeated message id raises
        Conflict, and nothing of the message is written.
        """
        db_now = now(self._tx.dialect)
        try:
            # A savepoint: a repeated id leaves no message behind, whatever the caller does
            # with its transaction then.
            async with self._tx.conn.begin_nested():
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
                            scheduled_for=scheduled_for,
                        )
                        .returning(*message.c)
                    )
                ).one()
                # The duplicate check (message_key: unique over every partition of message).
                await self._tx.conn.execute(
                    insert(message_key).values(
                        channel_id=channel_id, message_id=message_id, message_pk=row.pk
                    )
                )
        except IntegrityError:
            raise Conflict(
                f"message {message_id!r} already exists in channel {channel_id!r}"
            ) from None
        stored = message_from_row(row)
        await LedgerStore(self._tx).published(channel_id)
        fan_out = insert_queued_jobs(
            select(
                literal(stored.pk),
                consumer.c.pk,
                literal("QUEUED"),
                literal(priority),
                literal(len(payload)),
                db_now if scheduled_for is None else literal(scheduled_for, Timestamp()),
                db_now,
                db_now,
            ).where(
                consumer.c.channel_id == channel_id,
                # Still copying its history (app/bridge/backfill.py): not fanned out to.
                consumer.c.backfill_next.is_(None),
            )
        ).returning(job.c.consumer_pk)
        consumer_pks = list((await self._tx.conn.execute(fan_out)).scalars())
        return stored, consumer_pks

    async def get(self, channel_id: str, message_id: str) -> Message | None:
        query = select(message).where(message.c.pk == pk_of(channel_id, message_id))
        row = (await self._tx.conn.execute(query)).first()
        return message_from_row(row) if row else None

    async def cancel_scheduled(self, channel_id: str, message_id: str) -> bool:
        """Delete a scheduled message whose time has not come, and with it its jobs (none of
        them due yet, so none handed out); False when there is no such message."""
        # The message first, locked: its jobs were committed with it, so they are all there
        # and stay so (none is due yet). Its jobs and its key go after it, in this transaction
        # (no foreign key cascades: migration 0021), and the ledger counts the jobs removed.
        not_due = message.c.scheduled_for > now(self._tx.dialect)
        picked = select(message.c.pk).where(message.c.pk == pk_of(channel_id, message_id), not_due)
        if self._tx.dialect == "postgresql":
            # Only in an ATTACHED message partition, its state row locked FOR SHARE: one
            # exported whole is in the archive as it was marked, and the mark locks this row
            # before re-counting its messages (app/pipeline/partitions.py), so a cancel either
            # committed before and the mark is refused, or finds it EXPORTED and deletes nothing.
            part = message_partition
            picked = (
                picked.join_from(
                    message,
                    part,
                    and_(
                        message.c.pk >= func.coalesce(part.c.lower_id, MIN_ID),
                        message.c.pk < part.c.upper_id,
                        part.c.status == ATTACHED,
                    ),
                )
                .with_for_update(of=message)
                .suffix_with(f"FOR SHARE OF {part.name}")
            )
        else:
            picked = picked.with_for_update()
        found = (await self._tx.conn.execute(picked)).scalar_one_or_none()
        if found is None:
            return False
        owed = Counter(
            (
                await self._tx.conn.execute(
                    select(job.c.consumer_pk).where(job.c.message_pk == found)
                )
            ).scalars()
        )
        result = await self._tx.conn.execute(delete(message).where(message.c.pk == found, not_due))
        if not result.rowcount:
            return False
        await self._tx.conn.execute(delete(job).where(job.c.message_pk == found))
        await self._tx.conn.execute(
            delete(message_key).where(
                message_key.c.channel_id == channel_id,
                message_key.c.message_id == message_id,
                message_key.c.message_pk == found,
            )
        )
        await LedgerStore(self._tx).removed(owed)
        return True

    async def list(
        self,
        channel_id: str,
        cursor: Cursor,
        limit: int,
        *,
        scheduled_only: bool = False,
        due: bool | None = None,
    ) -> Page[Message]:
        """A channel's messages (or only its scheduled ones); `due`: only those whose jobs are
        due (True: not scheduled, or their time has come) or not yet (False)."""
        for given in (cursor.next, cursor.previous):
            # Drivers refuse integers beyond BIGINT (a 500); a forged cursor is a 400.
            if given is not None and not 0 <= decode_int_cursor(given) < 2**63:
                raise InvalidInput("malformed pagination cursor")
        base = select(message).where(message.c.channel_id == channel_id)
        if scheduled_only:
            base = base.where(message.c.scheduled_for.is_not(None))
        waiting = message.c.scheduled_for > now(self._tx.dialect)
        if due is False:
            base = base.where(message.c.scheduled_for.is_not(None), waiting)
        elif due is True:
            base = base.where(or_(message.c.scheduled_for.is_(None), ~waiting))
        rows = (
            await self._tx.conn.execute(paginate(base, message.c.pk, cursor, limit, True))
        ).all()
        items, next_cursor, previous_cursor = page_bounds(rows, cursor, limit, "pk")
        return Page([message_from_row(row) for row in items], next_cursor, previous_cursor)

    async def scheduled_job_count(self, channel_id: str) -> int:
        """Jobs of the channel's scheduled messages whose time has not come (ix_message_scheduled
        finds those messages: no scan of the channel's others)."""
        waiting = (
            select(func.count())
            .select_from(message.join(job, job.c.message_pk == message.c.pk))
            .where(
                message.c.channel_id == channel_id,
                message.c.scheduled_for.is_not(None),
                message.c.scheduled_for > now(self._tx.dialect),
                job.c.status == "QUEUED",
            )
        )
        return int((await self._tx.conn.execute(waiting)).scalar_one())
