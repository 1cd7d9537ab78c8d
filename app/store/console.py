"""The operator console's statements: the overview read from the counters, the bounded job
search, the bulk moves of dead jobs by id, and the audit log.

The overview is one statement for every consumer: its counts come from job_count (a few rows a
consumer), "due" is counted up to DUE_CAP along the claim index, and the oldest due job is one
step into ix_job_consumer_status. Nothing here counts a consumer's job rows whole.

A job list reads no payloads (it shows none; the job page reads its one). A text search is
settled by the database's byte match, so it reads none either; a field search must parse them,
and reads them newest first only up to a byte budget (a running sum the database keeps), so
that a search matching thousands of large payloads costs a bounded read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, ScalarSelect, delete, func, insert, literal, select, update

from app.domain.console import DUE_CAP, AuditEntry, ConsumerRow, JobFilter, PayloadQuery
from app.domain.models import Breaker, ClaimedJob
from app.store.db import Tx, now
from app.store.jobs import DEAD, QUEUED, job_from_row, status_is
from app.store.ledger import LedgerStore
from app.store.messages import message_from_mapping
from app.store.schema import (
    console_audit,
    consumer,
    consumer_group_state,
    job,
    job_count,
    message,
    message_key,
    push_state,
)


def _count(status: str) -> ScalarSelect[Any]:
    return (
        select(func.coalesce(func.sum(job_count.c.n), 0))
        .where(job_count.c.consumer_pk == consumer.c.pk, job_count.c.status == status)
        .scalar_subquery()
    )


class ConsoleStore:
    def __init__(self, tx: Tx) -> None:
        self._tx = tx
        self._now = now(tx.dialect)

    async def attempts(self, job_id: int) -> object:
        """A job's stored attempt history (app/store/attempts.py; None: none yet)."""
        query = select(job.c.attempts).where(job.c.id == job_id)
        found: object = (await self._tx.conn.execute(query)).scalar_one_or_none()
        return found

    async def overview(self) -> list[ConsumerRow]:
        due_now = [
            job.c.consumer_pk == consumer.c.pk,
            status_is(QUEUED),
            job.c.earliest_next_attempt_at <= self._now,
        ]
        due_rows = (
            select(job.c.id)
            .where(*due_now)
            .order_by(job.c.priority.desc(), job.c.id)
            .limit(DUE_CAP)
            .correlate(consumer)
            .subquery("due_rows")
        )
        due = select(func.count()).select_from(due_rows).scalar_subquery()
        oldest_due = (
            select(job.c.created_at).where(*due_now).order_by(job.c.id).limit(1).scalar_subquery()
        )
        query = (
            select(
                consumer.c.pk,
                consumer.c.channel_id,
                consumer.c.consumer_id,
                consumer.c.type,
                _count("QUEUED").label("queued"),
                due.label("due"),
                _count("INFLIGHT").label("inflight"),
                _count("DELIVERED").label("delivered"),
                _count("DEAD").label("dead"),
                oldest_due.label("oldest_due_at"),
                push_state.c.breaker,
                push_state.c.disabled_at,
                push_state.c.open_until,
                consumer.c.priority_group,
                consumer.c.priority_policy,
                consumer_group_state.c.pinned_id,
                consumer_group_state.c.pinned_at,
                consumer.c.paused_until,
            )
            .select_from(
                consumer.outerjoin(push_state, push_state.c.consumer_pk == consumer.c.pk).outerjoin(
                    consumer_group_state, consumer_group_state.c.consumer_pk == consumer.c.pk
                )
            )
            .order_by(consumer.c.channel_id, consumer.c.consumer_id)
        )
        rows = await self._tx.conn.execute(query)
        return [
            ConsumerRow(
                pk=r.pk,
                channel_id=r.channel_id,
                consumer_id=r.consumer_id,
                type=r.type,
                queued=int(r.queued),
                due=int(r.due),
                inflight=int(r.inflight),
                delivered=int(r.delivered),
                dead=int(r.dead),
                oldest_due_at=r.oldest_due_at,
                breaker=Breaker(r.breaker) if r.breaker else None,
                disabled=r.disabled_at is not None,
                open_until=r.open_until,
                priority_group=r.priority_group,
                priority_policy=r.priority_policy,
                pinned_id=r.pinned_id,
                pinned_at=r.pinned_at,
                paused_until=r.paused_until,
            )
            for r in rows
        ]

    def _where(self, consumer_pk: int, channel_id: str, which: JobFilter) -> list[Any]:
        where: list[Any] = [job.c.consumer_pk == consumer_pk]
        if which.status is not None:
            where.append(status_is(which.status.value))
        if which.since is not None:
            where.append(job.c.status_changed_at >= which.since)
        if which.until is not None:
            where.append(job.c.status_changed_at < which.until)
        if which.min_attempts:
            where.append(job.c.attempt >= which.min_attempts)
        if which.message_id:
            named = select(message_key.c.message_pk).where(
                message_key.c.channel_id == channel_id,
                message_key.c.message_id == which.message_id,
            )
            where.append(job.c.message_pk == named.scalar_subquery())
        return where

    def _contains(self, needle: bytes) -> ColumnElement[bool]:
        """The payload holds these bytes (case matters, any encoding): a narrowing the
        database does before the caller checks a field."""
        given = literal(needle, message.c.payload.type)
        if self._tx.dialect == "postgresql":
            return func.position(given.op("IN")(message.c.payload)) > 0
        return func.instr(message.c.payload, given) > 0

    def _candidates(self, where: list[Any], query: PayloadQuery, scan: int) -> Any:
        """The window's jobs whose payload holds the needle, each with its payload's size, the
        running sum of sizes newest first, and how many there are."""
        window = select(job.c.id).where(*where).order_by(job.c.id.desc()).limit(scan).cte("window")
        size = func.length(message.c.payload)
        return (
            select(
                job.c.id.label("id"),
                size.label("size"),
                func.sum(size).over(order_by=job.c.id.desc()).label("running"),
                func.count().over().label("total"),
            )
            .select_from(job.join(message, message.c.pk == job.c.message_pk))
            .where(job.c.id.in_(select(window.c.id)), self._contains(query.needle))
            .cte("candidates")
        )

    async def search(
        self,
        consumer_pk: int,
        channel_id: str,
        which: JobFilter,
        *,
        before: int | None,
        limit: int,
        scan: int,
        budget: int,
    ) -> tuple[list[ClaimedJob], int | None, int, bool]:
        """Jobs of the filter, newest first, below `before`: at most `limit`, without their
        payloads. With a payload search, only the `scan` newest jobs of the filter below
        `before` are read; the answer says how many were and the lowest id read (where the
        next page goes on). A field search's rows come with their payloads, newest first
        until `budget` bytes of them (the row that crosses it included); if that stopped the
        read above the window's end, the last element is True and the lowest id read is
        where the read stopped."""
        where = self._where(consumer_pk, channel_id, which)
        if before is not None:
            where.append(job.c.id < before)
        joined = job.join(message, message.c.pk == job.c.message_pk)
        listed = (*job.c, *[c.label(f"m_{c.name}") for c in message.c if c.name != "payload"])
        if which.payload is None:
            query = (
                select(*listed).select_from(joined).where(*where).order_by(job.c.id.desc())
            ).limit(limit)
            rows = list(await self._tx.conn.execute(query))
            return [_claimed(r) for r in rows], None, 0, False
        window = select(job.c.id).where(*where).order_by(job.c.id.desc()).limit(scan).cte("window")
        stats = select(func.count(), func.min(window.c.id)).select_from(window)
        scanned, lowest = (await self._tx.conn.execute(stats)).one()
        if not which.payload.field:
            query = (
                select(*listed)
                .select_from(joined)
                .where(job.c.id.in_(select(window.c.id)), self._contains(which.payload.needle))
                .order_by(job.c.id.desc())
            )
            rows = list(await self._tx.conn.execute(query))
            return [_claimed(r) for r in rows], lowest, int(scanned), False
        candidates = self._candidates(where, which.payload, scan)
        query = (
            select(*listed, message.c.payload.label("m_payload"), candidates.c.total)
            .select_from(joined.join(candidates, candidates.c.id == job.c.id))
            .where(candidates.c.running - candidates.c.size < budget)
            .order_by(job.c.id.desc())
        )
        rows = list(await self._tx.conn.execute(query))
        cut = bool(rows) and len(rows) < rows[0].total
        if cut:
            # The budget ran out above the window's end: the page read down to its last row.
            lowest = rows[-1].id
            above = select(func.count()).select_from(window).where(window.c.id >= lowest)
            scanned = (await self._tx.conn.execute(above)).scalar_one()
        return [_claimed(r) for r in rows], lowest, int(scanned), cut

    async def matching(
        self, consumer_pk: int, channel_id: str, which: JobFilter, *, scan: int, budget: int
    ) -> tuple[list[tuple[int, bytes | None]], bool]:
        """Ids of the filter's jobs, newest first, at most `scan` of them read, and whether a
        field search's byte budget ended the read early. A field search's ids come with their
        payloads (narrowed by the database, settled by the caller), newest first until
        `budget` bytes (the row that crosses it included); the others' need no check."""
        where = self._where(consumer_pk, channel_id, which)
        if which.payload is None:
            query = select(job.c.id).where(*where).order_by(job.c.id.desc()).limit(scan)
            return [(row.id, None) for row in await self._tx.conn.execute(query)], False
        if not which.payload.field:
            window = (
                select(job.c.id).where(*where).order_by(job.c.id.desc()).limit(scan).cte("window")
            )
            query = (
                select(job.c.id)
                .select_from(job.join(message, message.c.pk == job.c.message_pk))
                .where(job.c.id.in_(select(window.c.id)), self._contains(which.payload.needle))
                .order_by(job.c.id.desc())
            )
            return [(row.id, None) for row in await self._tx.conn.execute(query)], False
        candidates = self._candidates(where, which.payload, scan)
        query = (
            select(job.c.id, message.c.payload, candidates.c.total)
            .select_from(
                job.join(message, message.c.pk == job.c.message_pk).join(
                    candidates, candidates.c.id == job.c.id
                )
            )
            .where(candidates.c.running - candidates.c.size < budget)
            .order_by(job.c.id.desc())
        )
        rows = list(await self._tx.conn.execute(query))
        cut = bool(rows) and len(rows) < rows[0].total
        return [(row.id, bytes(row.payload)) for row in rows], cut

    async def requeue_dead(self, consumer_pk: int, ids: Sequence[int]) -> int:
        """These DEAD jobs of the consumer back to QUEUED, as a requeue does (the ones no longer
        DEAD are left alone)."""
        if not ids:
            return 0
        result = await self._tx.conn.execute(
            update(job)
            .where(job.c.consumer_pk == consumer_pk, job.c.id.in_(list(ids)), status_is(DEAD))
            .values(
                status=QUEUED,
                retry_count=0,
                earliest_next_attempt_at=self._now,
                dead_reason=None,
                status_changed_at=self._now,
            )
        )
        return int(result.rowcount or 0)

    async def delete_dead(self, consumer_pk: int, ids: Sequence[int]) -> int:
        if not ids:
            return 0
        result = await self._tx.conn.execute(
            delete(job).where(
                job.c.consumer_pk == consumer_pk, job.c.id.in_(list(ids)), status_is(DEAD)
            )
        )
        count = int(result.rowcount or 0)
        await LedgerStore(self._tx).removed({consumer_pk: count})
        return count

    async def record(
        self, role: str, session: str, action: str, target: str, jobs: int | None, detail: str
    ) -> None:
        await self._tx.conn.execute(
            insert(console_audit).values(
                at=self._now,
                role=role,
                session=session,
                action=action,
                target=target,
                jobs=jobs,
                detail=detail,
            )
        )

    async def audit(self, before: int | None, limit: int) -> list[AuditEntry]:
        query = select(console_audit).order_by(console_audit.c.id.desc()).limit(limit)
        if before is not None:
            query = query.where(console_audit.c.id < before)
        return [
            AuditEntry(r.id, r.at, r.role, r.session, r.action, r.target, r.jobs, r.detail)
            for r in await self._tx.conn.execute(query)
        ]


def _claimed(row: Any) -> ClaimedJob:
    # A listed row has no payload column: its message says b"" (the list shows no payload).
    fields = {c.name: row._mapping.get(f"m_{c.name}", b"") for c in message.c}
    return ClaimedJob(job_from_row(row), message_from_mapping(fields))
