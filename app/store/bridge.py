"""Statements only the NATS bridge needs: per-consumer delivery state, and releasing a claim
that could not be delivered (deliveries are numbered by the claim, app/store/queue.py).

Claims, acks, naks, terms and lease extensions are NOT here: the bridge uses JobStore's
statements for those, like every other entry point.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Float,
    case,
    cast,
    exists,
    func,
    select,
    tuple_,
    type_coerce,
    update,
)

from app.domain.jobs import JobStatus
from app.domain.models import Consumer, ConsumerType, StreamState
from app.store.db import Tx, now, plus_seconds, upsert
from app.store.jobs import status_in, status_is
from app.store.schema import bridge_consumer, channel, consumer, job, message
from app.store.stakeholders import consumer_from_row
from app.store.types import Timestamp

QUEUED = JobStatus.QUEUED.value
INFLIGHT = JobStatus.INFLIGHT.value


@dataclass(frozen=True, slots=True)
class DeliveryState:
    """What CONSUMER.INFO reports beyond the queue counts."""

    last_delivery_seq: int
    last_stream_seq: int
    last_delivered_at: datetime | None
    redelivered: int
    outstanding: int
    first_outstanding_id: int | None


class BridgeStore:
    def __init__(self, tx: Tx) -> None:
        self._tx = tx
        self._now = now(tx.dialect)

    async def record_delivery(self, consumer_pk: int, last_seq: int, last_stream_seq: int) -> None:
        """Remember the newest delivery of a consumer (never moves backwards)."""
        table = bridge_consumer
        stmt = upsert(self._tx.dialect, table).values(
            consumer_pk=consumer_pk,
            last_delivery_seq=last_seq,
            last_stream_seq=last_stream_seq,
            last_delivered_at=self._now,
        )
        excluded = stmt.excluded
        stmt = stmt.on_conflict_do_update(
            index_elements=[table.c.consumer_pk],
            set_={
                "last_delivery_seq": _greater(
                    excluded.last_delivery_seq, table.c.last_delivery_seq
                ),
                "last_stream_seq": _greater(excluded.last_stream_seq, table.c.last_stream_seq),
                "last_delivered_at": excluded.last_delivered_at,
            },
        )
        await self._tx.conn.execute(stmt)

    async def last_sequences(self, consumer_pk: int) -> tuple[int, int]:
        """The last delivery sequence and the last stream sequence (message pk) handed out (0, 0
        before any)."""
        row = (
            await self._tx.conn.execute(
                select(
                    bridge_consumer.c.last_delivery_seq, bridge_consumer.c.last_stream_seq
                ).where(bridge_consumer.c.consumer_pk == consumer_pk)
            )
        ).first()
        return (int(row.last_delivery_seq), int(row.last_stream_seq)) if row else (0, 0)

    async def delivery_state(self, consumer_pk: int) -> DeliveryState:
        row = (
            await self._tx.conn.execute(
                select(
                    bridge_consumer.c.last_delivery_seq,
                    bridge_consumer.c.last_stream_seq,
                    bridge_consumer.c.last_delivered_at,
                ).where(bridge_consumer.c.consumer_pk == consumer_pk)
            )
        ).first()
        delivered = job.c.attempt >= 1
        open_ = status_in(QUEUED, INFLIGHT)
        counts = (
            await self._tx.conn.execute(
                select(
                    func.count().filter(job.c.attempt >= 2),
                    func.count().filter(delivered),
                    func.min(job.c.message_pk).filter(delivered),
                ).where(job.c.consumer_pk == consumer_pk, open_)
            )
        ).one()
        return DeliveryState(
            last_delivery_seq=int(row.last_delivery_seq) if row else 0,
            last_stream_seq=int(row.last_stream_seq) if row else 0,
            last_delivered_at=row.last_delivered_at if row else None,
            redelivered=int(counts[0]),
            outstanding=int(counts[1]),
            first_outstanding_id=int(counts[2]) if counts[2] is not None else None,
        )

    async def release(
        self, consumer_pk: int, targets: Seq[tuple[int, int]], *, sent: bool = False
    ) -> int:
        """INFLIGHT -> QUEUED for claims nobody took: due now, no retry counted (fenced on
        (id, attempt) so a later claim is untouched). The attempt is given back unless the
        job was `sent` (a stream whose client went away): then its receiver may still hold
        it, and its ack for that attempt must stay stale once the job is claimed again."""
        return await self._update_claims(
            consumer_pk,
            targets,
            status=QUEUED,
            attempt=job.c.attempt if sent else job.c.attempt - 1,
            lease_expires_at=None,
            earliest_next_attempt_at=self._now,
            status_changed_at=self._now,
        )

    async def _update_claims(
        self, consumer_pk: int, targets: Seq[tuple[int, int]], **values: Any
    ) -> int:
        """Sets `values` on the consumer's jobs still INFLIGHT under these (id, attempt) claims:
        fenced on both, so a job acked, released or claimed again meanwhile is untouched."""
        if not targets:
            return 0
        result = await self._tx.conn.execute(
            update(job)
            .where(
                job.c.consumer_pk == consumer_pk,
                status_is(INFLIGHT),
                tuple_(job.c.id, job.c.attempt).in_(list(targets)),
            )
            .values(**values)
        )
        return int(result.rowcount or 0)

    async def account_counts(self) -> tuple[int, int]:
        """Channels, and pull consumers (the ones a JetStream client can bind to)."""
        query = select(
            select(func.count()).select_from(channel).scalar_subquery(),
            select(func.count())
            .where(consumer.c.type == ConsumerType.PULL.value)
            .scalar_subquery(),
        )
        streams, consumers = (await self._tx.conn.execute(query)).one()
        return int(streams), int(consumers)

    async def stream_state(self, channel_id: str) -> StreamState | None:
        """None when there is no such channel. Counts the channel's messages (not a hot path:
        clients ask once, when they bind)."""
        pulls = select(consumer.c.pk).where(
            consumer.c.channel_id == channel_id, consumer.c.type == ConsumerType.PULL.value
        )
        in_channel = message.c.channel_id == channel_id
        query = select(
            select(channel.c.created_at).where(channel.c.id == channel_id).scalar_subquery(),
            select(func.count()).where(in_channel).scalar_subquery(),
            select(func.coalesce(func.sum(func.length(message.c.payload)), 0))
            .where(in_channel)
            .scalar_subquery(),
            select(func.min(message.c.received_at)).where(in_channel).scalar_subquery(),
            select(func.max(message.c.received_at)).where(in_channel).scalar_subquery(),
            # Stream sequences are message pks (ix_message_channel_id_pk's two ends).
            select(func.coalesce(func.min(message.c.pk), 0)).where(in_channel).scalar_subquery(),
            select(func.coalesce(func.max(message.c.pk), 0)).where(in_channel).scalar_subquery(),
            select(func.count()).select_from(pulls.subquery()).scalar_subquery(),
        )
        row = (await self._tx.conn.execute(query)).one()
        created, messages, size, first_at, last_at, first_seq, last_seq, consumers = row
        if created is None:
            return None
        return StreamState(
            created=created,
            messages=int(messages),
            bytes=int(size),
            first_seq=int(first_seq),
            last_seq=int(last_seq),
            first_at=first_at,
            last_at=last_at,
            consumers=int(consumers),
        )

    async def channel_ids(self) -> list[str]:
        rows = await self._tx.conn.execute(select(channel.c.id).order_by(channel.c.id))
        return [str(v) for v in rows.scalars()]

    async def pull_consumer_page(
        self, channel_id: str, offset: int, limit: int
    ) -> tuple[int, list[Consumer]]:
        """CONSUMER.NAMES / LIST: how many pull consumers the channel has, and those from
        `offset` on in name order (the order nats-server pages them in)."""
        pulls = (consumer.c.channel_id == channel_id) & (consumer.c.type == ConsumerType.PULL.value)
        total = (
            await self._tx.conn.execute(select(func.count()).select_from(consumer).where(pulls))
        ).scalar_one()
        rows = await self._tx.conn.execute(
            select(consumer)
            .where(pulls)
            .order_by(consumer.c.consumer_id)
            .offset(offset)
            .limit(limit)
        )
        return int(total), [consumer_from_row(row) for row in rows]

    async def job_ids_by_message(self, consumer_pk: int, message_pks: Seq[int]) -> dict[int, int]:
        """{message pk: job id} of a consumer's jobs for these messages: a push delivery's ack
        names its message, as nats-server's reply subjects do (ix_job_message_pk)."""
        if not message_pks:
            return {}
        rows = await self._tx.conn.execute(
            select(job.c.message_pk, job.c.id).where(
                job.c.message_pk.in_(list(message_pks)), job.c.consumer_pk == consumer_pk
            )
        )
        return {int(message_pk): int(job_id) for message_pk, job_id in rows}

    async def holds_messages(self, channel_id: str) -> bool:
        """Whether the channel stores any message (one probe of its index)."""
        query = select(message.c.pk).where(message.c.channel_id == channel_id).limit(1)
        return (await self._tx.conn.execute(query)).first() is not None

    async def extend_leases(
        self, consumer_pk: int, targets: Seq[tuple[int, int]], seconds: int
    ) -> int:
        """A backoff consumer's delivery: its lease runs `seconds` from its claim, not the ack
        wait (fenced on (id, attempt) and INFLIGHT, so a job acked or claimed again meanwhile
        is untouched)."""
        lease = plus_seconds(self._tx.dialect, job.c.claimed_at, seconds)
        return await self._update_claims(consumer_pk, targets, lease_expires_at=lease)

    # -- inactive thresholds (ephemeral consumers; migration 0014) ----------------------------

    async def mark_active(self, consumer_pks: Seq[int]) -> int:
        """Consumers in use (a pull request waiting or arrived, a delivery, an ack): their
        inactivity starts over. Only those that can expire are written."""
        if not consumer_pks:
            return 0
        result = await self._tx.conn.execute(
            update(consumer)
            .where(
                consumer.c.pk.in_(list(consumer_pks)), consumer.c.inactive_threshold.is_not(None)
            )
            .values(last_active_at=self._now)
        )
        return int(result.rowcount or 0)

    def _inactive_since(self) -> ColumnElement[Any]:
        """When an expiring consumer's threshold runs out, counted from its last use."""
        seconds = cast(consumer.c.inactive_threshold, Float) / 1e9
        return plus_seconds(
            self._tx.dialect,
            func.coalesce(consumer.c.last_active_at, consumer.c.created_at),
            seconds,
        )

    def _inactive(self) -> list[ColumnElement[bool]]:
        """Past its threshold, and no delivery whose ack wait (plus the threshold) is still
        running: nats-server waits for the last delivery it may still be acked for."""
        seconds = cast(consumer.c.inactive_threshold, Float) / 1e9
        lease_running = exists().where(
            job.c.consumer_pk == consumer.c.pk,
            status_is(INFLIGHT),
            plus_seconds(self._tx.dialect, job.c.lease_expires_at, seconds) > self._now,
        )
        return [
            consumer.c.inactive_threshold.is_not(None),
            self._inactive_since() < self._now,
            ~lease_running,
        ]

    async def inactive_consumers(self, limit: int) -> list[tuple[str, str]]:
        """(channel, consumer) of consumers past their inactive threshold."""
        rows = await self._tx.conn.execute(
            select(consumer.c.channel_id, consumer.c.consumer_id)
            .where(*self._inactive())
            .order_by(consumer.c.pk)
            .limit(limit)
        )
        return [(str(r.channel_id), str(r.consumer_id)) for r in rows]

    async def still_inactive(self, consumer_pk: int) -> bool:
        """Re-checked under the consumer's row lock, just before it is deleted."""
        query = select(consumer.c.pk).where(consumer.c.pk == consumer_pk, *self._inactive())
        return (await self._tx.conn.execute(query)).first() is not None

    async def next_inactive_at(self) -> datetime | None:
        """The earliest moment an expiring consumer may run out (None: none can)."""
        query = select(type_coerce(func.min(self._inactive_since()), Timestamp())).where(
            consumer.c.inactive_threshold.is_not(None)
        )
        value: datetime | None = (await self._tx.conn.execute(query)).scalar_one_or_none()
        return value


def _greater(a: ColumnElement[Any], b: ColumnElement[Any]) -> ColumnElement[Any]:
    return case((a > b, a), else_=b)
