"""A consumer's history: the jobs for its channel's stored messages, copied in message-pk
(stream sequence) order while publishes pass it by (`consumer.backfill_next`, migration 0017).

Each chunk locks the consumer row only if its cursor is where the caller read it, copies the
next messages from there and moves the cursor past them, in the caller's transaction: a crash
loses nothing (the transaction rolls back whole) and two bridges never copy one message twice
(the second finds the cursor moved). The jobs copied are added to the consumer's ledger
opening balance by the statement that moves the cursor.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, insert, literal, select, update

from app.domain.jobs import JobStatus
from app.store.db import Tx, now
from app.store.ledger import LedgerStore
from app.store.schema import channel, consumer, job, message


class BackfillStore:
    def __init__(self, tx: Tx) -> None:
        self._tx = tx

    async def start_at(
        self, channel_id: str, policy: str, start_seq: int, start_time: datetime | None
    ) -> int:
        """The first message pk a history deliver policy copies (stream sequences are pks)."""
        in_channel = message.c.channel_id == channel_id
        if policy in ("last", "last_per_subject"):
            query = select(func.coalesce(func.max(message.c.pk), 0)).where(in_channel)
            return int((await self._tx.conn.execute(query)).scalar_one())
        if policy == "by_start_sequence":
            return start_seq
        if policy == "by_start_time" and start_time is not None:
            # Walked back from the newest message (ix_message_channel_id_pk): a recent start
            # reads a few rows. Publish times rise with pks except between concurrent
            # publishes, so the start is the first message after the last one before it.
            before = (
                select(message.c.pk)
                .where(in_channel, message.c.received_at < start_time)
                .order_by(message.c.pk.desc())
                .limit(1)
            )
            found = (await self._tx.conn.execute(before)).scalar_one_or_none()
            return 0 if found is None else int(found) + 1
        return 0  # all

    async def begin(self, consumer_pk: int, start: int) -> None:
        """The new consumer copies from `start` before it goes live."""
        await self._tx.conn.execute(
            update(consumer).where(consumer.c.pk == consumer_pk).values(backfill_next=start)
        )
        await LedgerStore(self._tx).suspend(consumer_pk)

    async def copying(self, limit: int) -> list[tuple[int, int]]:
        """(consumer pk, cursor) of consumers still copying (ix_consumer_backfill)."""
        query = (
            select(consumer.c.pk, consumer.c.backfill_next)
            .where(consumer.c.backfill_next.is_not(None))
            .order_by(consumer.c.pk)
            .limit(limit)
        )
        return [(int(pk), int(at)) for pk, at in await self._tx.conn.execute(query)]

    async def lock_channel(self, channel_id: str) -> bool:
        """The channel row, locked FOR UPDATE: every publish holds a key share on its channel
        row until it commits (message's foreign key), so this waits for the publishes in
        flight and holds new ones until the caller commits. False: no such channel."""
        query = select(channel.c.id).where(channel.c.id == channel_id).with_for_update()
        return (await self._tx.conn.execute(query)).first() is not None

    async def channel_of(self, consumer_pk: int) -> str | None:
        query = select(consumer.c.channel_id).where(consumer.c.pk == consumer_pk)
        found: str | None = (await self._tx.conn.execute(query)).scalar_one_or_none()
        return found

    async def copy(self, consumer_pk: int, cursor: int, limit: int) -> tuple[int, int] | None:
        """Jobs for the next `limit` messages from `cursor` on, the cursor moved past them: how
        many were copied and the cursor now, or None: the consumer is gone, live, or copied by
        another process."""
        locked = (
            select(consumer.c.channel_id)
            .where(consumer.c.pk == consumer_pk, consumer.c.backfill_next == cursor)
            .with_for_update(key_share=True)  # FOR NO KEY UPDATE: claims' key shares pass
        )
        channel_id = (await self._tx.conn.execute(locked)).scalar_one_or_none()
        if channel_id is None:
            return None
        db_now = now(self._tx.dialect)
        picked = (
            select(
                message.c.pk,
                literal(consumer_pk),
                literal(JobStatus.QUEUED.value),
                message.c.priority,
                func.length(message.c.payload),
                func.coalesce(message.c.scheduled_for, db_now),
                db_now,
                db_now,
            )
            .where(message.c.channel_id == channel_id, message.c.pk >= cursor)
            # Jobs take their ids in message order: the claim hands them out in id order.
            .order_by(message.c.pk)
            .limit(limit)
        )
        copied = (
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
                picked,
            )
            .returning(job.c.message_pk)
        )
        pks = list((await self._tx.conn.execute(copied)).scalars())
        if not pks:
            return 0, cursor
        moved = (
            update(consumer)
            .where(consumer.c.pk == consumer_pk, consumer.c.backfill_next == cursor)
            .values(
                backfill_next=max(pks) + 1,
                ledger_opening=consumer.c.ledger_opening + len(pks),
            )
        )
        await self._tx.conn.execute(moved)
        return len(pks), max(pks) + 1

    async def cursor(self, consumer_pk: int) -> int | None:
        query = select(consumer.c.backfill_next).where(consumer.c.pk == consumer_pk)
        value = (await self._tx.conn.execute(query)).scalar_one_or_none()
        return None if value is None else int(value)

    async def go_live(self, consumer_pk: int, channel_id: str, cursor: int) -> bool:
        return await LedgerStore(self._tx).go_live(consumer_pk, channel_id, cursor)
