"""A consumer's history: the jobs for its channel's stored messages, copied in message-pk
(stream sequence) order while publishes pass it by (`consumer.backfill_next`, migration 0017).

Each chunk locks the consumer row only if its cursor is where the caller read it, copies the
next messages from there and moves the cursor past them, in the caller's transaction: a crash
loses nothing (the transaction rolls back whole) and two bridges never copy one message twice
(the second finds the cursor moved). The jobs copied are added to the consumer's ledger
opening balance by the statement that moves the cursor.

The switch to live records itself in the consumer's row (`switched_at`, migration 0019) for
the publishes that raced it (app/services/backfill.py): `make_up` gives the consumer a job for
each that has committed since and clears the record once they all must have, whichever process
runs it, as often as it is run.
"""

from __future__ import annotations

import itertools
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, func, literal, select, update

from app.domain.jobs import JobStatus
from app.store.db import Tx, now, plus_seconds
from app.store.ledger import LedgerStore
from app.store.messages import insert_queued_jobs
from app.store.partitions import ATTACHED, MIN_ID
from app.store.schema import channel, consumer, job, message, message_partition


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

    async def more_than(self, channel_id: str, start: int, count: int) -> bool:
        """Does the channel hold more than `count` messages from `start` on."""
        query = (
            select(message.c.pk)
            .where(message.c.channel_id == channel_id, message.c.pk >= start)
            .order_by(message.c.pk)
            .offset(count)
            .limit(1)
        )
        return (await self._tx.conn.execute(query)).first() is not None

    async def begin(self, consumer_pk: int, start: int) -> None:
        """The new consumer copies from `start` before it goes live; `start` is kept as its
        opt_start_seq (reported only for by_start_sequence, where it is the one asked for)."""
        await self._tx.conn.execute(
            update(consumer)
            .where(consumer.c.pk == consumer_pk)
            .values(backfill_next=start, opt_start_seq=start)
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

    async def copy(
        self, consumer_pk: int, cursor: int, limit: int, *, fresh_from: datetime | None = None
    ) -> tuple[int, int] | None:
        """Jobs for the next `limit` messages from `cursor` on, the cursor moved past them: how
        many were copied and the cursor now, or None: the consumer is gone, live, or copied by
        another process. With `fresh_from`, the copy stops before the first message received
        since then: a publish still running may hold a smaller id, and a cursor moved past it
        would never come back for it (the switch copies those, the channel locked)."""
        locked = (
            select(consumer.c.channel_id)
            .where(consumer.c.pk == consumer_pk, consumer.c.backfill_next == cursor)
            .with_for_update(key_share=True)  # FOR NO KEY UPDATE: claims' key shares pass
        )
        channel_id = (await self._tx.conn.execute(locked)).scalar_one_or_none()
        if channel_id is None:
            return None
        in_range = (message.c.channel_id == channel_id, message.c.pk >= cursor)
        next_ones = select(message.c.pk, message.c.received_at).where(*in_range)
        rows = (await self._tx.conn.execute(next_ones.order_by(message.c.pk).limit(limit))).all()
        if fresh_from is not None:
            rows = list(itertools.takewhile(lambda row: row.received_at < fresh_from, rows))
        if not rows:
            return 0, cursor
        last = int(rows[-1].pk)
        picked = (
            self._jobs_for(consumer_pk)
            .where(*in_range, message.c.pk <= last)
            # Jobs take their ids in message order: the claim hands them out in id order.
            .order_by(message.c.pk)
        )
        copied = await self._insert(picked)
        moved = (
            update(consumer)
            .where(consumer.c.pk == consumer_pk, consumer.c.backfill_next == cursor)
            .values(backfill_next=last + 1, ledger_opening=consumer.c.ledger_opening + copied)
        )
        await self._tx.conn.execute(moved)
        return copied, last + 1

    async def cursor(self, consumer_pk: int) -> int | None:
        query = select(consumer.c.backfill_next).where(consumer.c.pk == consumer_pk)
        value = (await self._tx.conn.execute(query)).scalar_one_or_none()
        return None if value is None else int(value)

    async def go_live(self, consumer_pk: int, channel_id: str, since: int, cursor: int) -> bool:
        """The consumer live from the channel's next generation on, owed every publish that
        fans out to it as a consumer created now is, and its switch recorded for make_up:
        `since` is the cursor when the channel was locked (a publish racing the switch holds a
        pk from there on: smaller ones were copied before, unlocked, only once older than
        app/services/backfill.FRESH). False: its copy is not at `cursor`. The channel is locked:
        every publish counted before the new generation has committed."""
        ledger = LedgerStore(self._tx)
        born = await ledger.next_generation(channel_id)
        if born is None:
            return False
        counted = await ledger.counted_before(channel_id, born)
        live = (
            update(consumer)
            .where(consumer.c.pk == consumer_pk, consumer.c.backfill_next == cursor)
            .values(
                backfill_next=None,
                ledger_from=born,
                switched_at=self._clock(),
                switch_from=since,
                switch_counted=counted,
            )
        )
        return bool((await self._tx.conn.execute(live)).rowcount)

    async def switches(self, limit: int) -> list[tuple[int, int]]:
        """(consumer pk, switch_counted) of the switches recorded (ix_consumer_switched_at)."""
        query = (
            select(consumer.c.pk, consumer.c.switch_counted)
            .where(consumer.c.switched_at.is_not(None))
            .order_by(consumer.c.pk)
            .limit(limit)
        )
        return [(int(pk), int(counted)) for pk, counted in await self._tx.conn.execute(query)]

    async def make_up(self, consumer_pk: int, counted: int, settle: float) -> int | None:
        """Jobs for the publishes that raced the consumer's switch and have committed since,
        added to its opening balance; the record cleared once the switch is `settle` seconds
        old (every racing publish has committed by then). How many were made, or None: no such
        record at `counted` (made up and moved on by another process, or the consumer gone).

        A racing publish counts itself in the ledger under a generation before the consumer's,
        after the switch read those counts (switch_counted): the counts' rise says how many
        there are. Each is a message from switch_from on with no job for the consumer (every
        other there was copied or fanned out to it); at most that many are made, so a job
        deleted on purpose meanwhile is not made again. The consumer row, locked at `counted`
        first, keeps two processes from making the same jobs."""
        dialect = self._tx.dialect
        settled = consumer.c.switched_at <= plus_seconds(dialect, now(dialect), -settle)
        locked = (
            select(
                consumer.c.channel_id,
                consumer.c.ledger_from,
                consumer.c.switch_from,
                settled.label("settled"),
            )
            .where(
                consumer.c.pk == consumer_pk,
                consumer.c.switched_at.is_not(None),
                consumer.c.switch_counted == counted,
            )
            .with_for_update(key_share=True)  # FOR NO KEY UPDATE: publishes' key shares pass
        )
        row = (await self._tx.conn.execute(locked)).first()
        if row is None:
            return None
        raced = await LedgerStore(self._tx).counted_before(row.channel_id, row.ledger_from)
        made = 0
        if raced > counted:
            has_job = (
                select(job.c.id)
                .where(job.c.message_pk == message.c.pk, job.c.consumer_pk == consumer_pk)
                .exists()
            )
            picked = (
                self._jobs_for(consumer_pk)
                .where(
                    message.c.channel_id == row.channel_id,
                    message.c.pk >= row.switch_from,
                    ~has_job,
                )
                .order_by(message.c.pk)
                .limit(raced - counted)
            )
            made = await self._insert(picked)
        if not made and not row.settled:
            return 0
        values: dict[str, Any] = {
            "switch_counted": counted + made,
            "ledger_opening": consumer.c.ledger_opening + made,
        }
        if row.settled:
            values.update(switched_at=None, switch_from=None, switch_counted=None)
        await self._tx.conn.execute(
            update(consumer)
            .where(consumer.c.pk == consumer_pk, consumer.c.switch_counted == counted)
            .values(**values)
        )
        return made

    def _jobs_for(self, consumer_pk: int) -> Select[Any]:
        """A QUEUED job's columns for each message selected, in QUEUED_JOB_COLUMNS' order.

        Each message is locked FOR KEY SHARE, as a foreign key's check would lock it (none
        points at message: migration 0021): the archive's delete of a message waits for this
        copy to commit and then finds its new job, or this copy waits for the delete and skips
        the message gone.

        On PostgreSQL only messages of an ATTACHED message partition get a job, its state row
        locked FOR SHARE: a job made for a partition exported whole would point at a message
        its detach hides (a claim would find nothing, and burn an attempt). The export's mark
        locks that row first (app/pipeline/partitions.py), so it waits for a copy in flight
        and then finds its job; a copy after the mark re-reads the row (READ COMMITTED), finds
        it EXPORTED and skips its messages. SQLite has no message partitions."""
        dialect = self._tx.dialect
        db_now = now(dialect)
        picked = select(
            message.c.pk,
            literal(consumer_pk),
            literal(JobStatus.QUEUED.value),
            message.c.priority,
            func.length(message.c.payload),
            func.coalesce(message.c.scheduled_for, db_now),
            db_now,
            db_now,
        )
        if dialect != "postgresql":
            return picked.with_for_update(read=True, key_share=True, of=message)
        part = message_partition
        in_partition = and_(
            message.c.pk >= func.coalesce(part.c.lower_id, MIN_ID),
            message.c.pk < part.c.upper_id,
            part.c.status == ATTACHED,
        )
        return (
            picked.join_from(message, part, in_partition)
            .with_for_update(read=True, key_share=True, of=message)
            # A second locking clause (SQLAlchemy renders one): after ORDER BY and LIMIT.
            .suffix_with(f"FOR SHARE OF {part.name}")
        )

    async def _insert(self, picked: Select[Any]) -> int:
        """The jobs `picked` selects (as _jobs_for), inserted: how many."""
        made = insert_queued_jobs(picked).returning(job.c.id)
        return len(list((await self._tx.conn.execute(made)).scalars()))

    def _clock(self) -> ColumnElement[Any]:
        """The database's time of the statement (PostgreSQL's now() is its transaction's
        start, which a creation waiting for the channel's lock may have begun well before)."""
        if self._tx.dialect == "postgresql":
            return func.statement_timestamp()
        return now(self._tx.dialect)
