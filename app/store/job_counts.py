"""Job counts by consumer and status, read from the trigger-kept `job_count` rows.

Nothing here counts job rows: the sums come from `job_count` (a few rows per consumer, see
migration 0006_job_counts), and the oldest / newest job of a (consumer, status) is one step
into each end of ix_job_consumer_status. So these stay as fast at tens of millions of jobs as
at ten (bench/status.py measures it).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import ColumnElement, ScalarSelect, Select, func, select

from app.domain.models import DeadCount, StatusCount
from app.store.db import Tx
from app.store.schema import channel, consumer, job, job_count


def _sums(*, status: str | None = None) -> Select[tuple[int, str, int]]:
    query = select(
        job_count.c.consumer_pk, job_count.c.status, func.sum(job_count.c.n).label("n")
    ).group_by(job_count.c.consumer_pk, job_count.c.status)
    if status is not None:
        query = query.where(job_count.c.status == status)
    # Rows of a deleted consumer net to zero and drop out here.
    return query.having(func.sum(job_count.c.n) != 0)


def _end_created_at(
    consumer_pk: ColumnElement[int], status: ColumnElement[str], *, last: bool
) -> ScalarSelect[datetime]:
    order = job.c.id.desc() if last else job.c.id
    return (
        select(job.c.created_at)
        .where(job.c.consumer_pk == consumer_pk, job.c.status == status)
        .order_by(order)
        .limit(1)
        .scalar_subquery()
    )


class JobCountStore:
    def __init__(self, tx: Tx) -> None:
        self._tx = tx

    async def by_consumer_and_status(self) -> Sequence[StatusCount]:
        sums = _sums().subquery("sums")
        query = (
            select(
                consumer.c.channel_id,
                consumer.c.consumer_id,
                sums.c.status,
                sums.c.n,
                _end_created_at(sums.c.consumer_pk, sums.c.status, last=False).label("oldest"),
                _end_created_at(sums.c.consumer_pk, sums.c.status, last=True).label("newest"),
            )
            .select_from(sums.join(consumer, consumer.c.pk == sums.c.consumer_pk))
            .order_by(consumer.c.channel_id, consumer.c.consumer_id, sums.c.status)
        )
        rows = await self._tx.conn.execute(query)
        return [StatusCount(r[0], r[1], r[2], int(r[3]), r[4], r[5]) for r in rows]

    async def dead_by_consumer(self) -> Sequence[DeadCount]:
        sums = _sums(status="DEAD").subquery("sums")
        query = (
            select(channel.c.id, channel.c.name, consumer.c.consumer_id, consumer.c.name, sums.c.n)
            .select_from(
                sums.join(consumer, consumer.c.pk == sums.c.consumer_pk).join(
                    channel, channel.c.id == consumer.c.channel_id
                )
            )
            .order_by(channel.c.id, consumer.c.consumer_id)
        )
        rows = await self._tx.conn.execute(query)
        return [DeadCount(r[0], r[1], r[2], r[3], int(r[4])) for r in rows]

    async def for_channel(self, channel_id: str) -> dict[str, int]:
        """The channel's jobs by status (those of its consumers: every job of its messages)."""
        sums = _sums().subquery("sums")
        query = (
            select(sums.c.status, func.sum(sums.c.n))
            .select_from(sums.join(consumer, consumer.c.pk == sums.c.consumer_pk))
            .where(consumer.c.channel_id == channel_id)
            .group_by(sums.c.status)
        )
        return {status: int(n) for status, n in await self._tx.conn.execute(query)}

    async def for_consumer(self, consumer_pk: int, status: str) -> int:
        query = select(func.coalesce(func.sum(job_count.c.n), 0)).where(
            job_count.c.consumer_pk == consumer_pk, job_count.c.status == status
        )
        return int((await self._tx.conn.execute(query)).scalar_one())
