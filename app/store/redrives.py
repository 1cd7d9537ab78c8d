"""Redrive rows: start one, take a due chunk, record its progress, cancel."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Row, case, func, insert, select, update

from app.domain.jobs import JobStatus
from app.domain.models import Redrive
from app.store.db import Tx, now, plus_seconds
from app.store.schema import job, redrive


def redrive_from_row(row: Row[Any]) -> Redrive:
    return Redrive(
        id=row.id,
        consumer_pk=row.consumer_pk,
        from_status=JobStatus(row.from_status),
        changed_since=row.changed_since,
        changed_until=row.changed_until,
        per_second=row.per_second,
        status=row.status,
        total=row.total,
        moved=row.moved,
        cursor=row.cursor,
        upper_id=row.upper_id,
        created_at=row.created_at,
        finished_at=row.finished_at,
    )


# Redrive.chunk in SQL (integer division rounds up the tenth): the time one chunk takes at
# the redrive's rate, by which its next chunk is put off.
_CHUNK = case((redrive.c.per_second > 10_000, 1000), else_=(redrive.c.per_second + 9) / 10)
_CHUNK_SECONDS = _CHUNK * 1.0 / redrive.c.per_second


class RedriveStore:
    def __init__(self, tx: Tx) -> None:
        self._tx = tx
        self._now = now(tx.dialect)

    async def start(
        self,
        consumer_pk: int,
        from_status: JobStatus,
        since: datetime | None,
        until: datetime | None,
        per_second: int,
        total: int,
    ) -> Redrive:
        """A running redrive over the jobs there now (ids up to today's highest)."""
        highest = select(func.coalesce(func.max(job.c.id), 0)).scalar_subquery()
        query = (
            insert(redrive)
            .values(
                consumer_pk=consumer_pk,
                from_status=from_status.value,
                changed_since=since,
                changed_until=until,
                per_second=per_second,
                status="RUNNING",
                total=total,
                upper_id=highest,
                next_chunk_at=self._now,
                created_at=self._now,
            )
            .returning(*redrive.c)
        )
        return redrive_from_row((await self._tx.conn.execute(query)).one())

    async def get(self, consumer_pk: int, redrive_id: int) -> Redrive | None:
        query = select(redrive).where(
            redrive.c.id == redrive_id, redrive.c.consumer_pk == consumer_pk
        )
        row = (await self._tx.conn.execute(query)).one_or_none()
        return redrive_from_row(row) if row is not None else None

    async def for_consumer(self, consumer_pk: int, limit: int) -> Sequence[Redrive]:
        query = (
            select(redrive)
            .where(redrive.c.consumer_pk == consumer_pk)
            .order_by(redrive.c.id.desc())
            .limit(limit)
        )
        return [redrive_from_row(row) for row in await self._tx.conn.execute(query)]

    async def take_due(self) -> Redrive | None:
        """The running redrive whose next chunk is due, its next chunk put a chunk's time
        ahead: one conditional UPDATE, so of two runners only one takes a given chunk (and the
        row stays locked, on PostgreSQL, until the chunk's transaction ends)."""
        due = (
            select(redrive.c.id)
            .where(redrive.c.status == "RUNNING", redrive.c.next_chunk_at <= self._now)
            .order_by(redrive.c.next_chunk_at)
            .limit(1)
        )
        if self._tx.dialect == "postgresql":
            due = due.with_for_update(skip_locked=True)
        query = (
            update(redrive)
            .where(
                redrive.c.id == due.scalar_subquery(),
                redrive.c.status == "RUNNING",
                redrive.c.next_chunk_at <= self._now,
            )
            .values(next_chunk_at=plus_seconds(self._tx.dialect, self._now, _CHUNK_SECONDS))
            .returning(*redrive.c)
        )
        row = (await self._tx.conn.execute(query)).one_or_none()
        return redrive_from_row(row) if row is not None else None

    async def next_due_at(self) -> datetime | None:
        query = select(func.min(redrive.c.next_chunk_at)).where(redrive.c.status == "RUNNING")
        found: datetime | None = (await self._tx.conn.execute(query)).scalar_one()
        return found

    async def advance(self, redrive_id: int, cursor: int, moved: int, *, done: bool) -> None:
        values: dict[str, Any] = {"cursor": cursor, "moved": redrive.c.moved + moved}
        if done:
            values |= {"status": "COMPLETED", "finished_at": self._now}
        await self._tx.conn.execute(
            update(redrive)
            .where(redrive.c.id == redrive_id, redrive.c.status == "RUNNING")
            .values(**values)
        )

    async def cancel(self, consumer_pk: int, redrive_id: int) -> Redrive | None:
        """RUNNING -> CANCELLED; None when it is not running (or not this consumer's)."""
        query = (
            update(redrive)
            .where(
                redrive.c.id == redrive_id,
                redrive.c.consumer_pk == consumer_pk,
                redrive.c.status == "RUNNING",
            )
            .values(status="CANCELLED", finished_at=self._now)
            .returning(*redrive.c)
        )
        row = (await self._tx.conn.execute(query)).one_or_none()
        return redrive_from_row(row) if row is not None else None
