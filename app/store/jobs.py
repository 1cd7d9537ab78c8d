"""Delivery jobs: the claim, transition and sweep statements every entry point shares.

Every state change below is ONE conditional UPDATE (`... WHERE status = :from ... RETURNING`):
when two callers race, the database lets exactly one row change and the loser sees no row.
Times come from the database clock (`now()`), never from the caller's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Integer,
    Row,
    and_,
    bindparam,
    case,
    delete,
    exists,
    func,
    literal,
    literal_column,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY

from app.domain.errors import InvalidInput
from app.domain.jobs import JobStatus, RetryPolicy
from app.domain.models import ClaimedJob, Cursor, Job, Message, Page
from app.store import attempts
from app.store.db import Tx, now, plus_seconds
from app.store.ledger import LedgerStore
from app.store.messages import message_from_row
from app.store.pagination import decode_cursor, encode_cursor
from app.store.pauses import not_paused
from app.store.schema import consumer, job, message

# Pull responses and ack subjects count due jobs left up to this many: an exact count of a
# deep backlog on every claim would cost more than the claim itself.
PENDING_COUNT_CAP = 1000

# A transition's answer: the job without its attempt history (the console alone reads it).
RETURNED = tuple(c for c in job.c if c.name != "attempts")
NAKED = attempts.note("nak")
EXPIRED = attempts.note("expired", error="the lease expired before an ack")

QUEUED = JobStatus.QUEUED.value
INFLIGHT = JobStatus.INFLIGHT.value
DELIVERED = JobStatus.DELIVERED.value
DEAD = JobStatus.DEAD.value


def status_is(status: str) -> ColumnElement[bool]:
    """`job.status = '<status>'` with the value inline, not bound.

    The claim and sweep indexes are partial (WHERE status = 'QUEUED' / 'INFLIGHT'). A bound
    parameter hides the value from a generic prepared plan, which then cannot use them and
    scans the whole backlog instead.
    """
    return job.c.status == literal_column(f"'{JobStatus(status).value}'")


def status_by_key(status: str) -> ColumnElement[bool]:
    """`job.status = '<status>'` written so that no index on status can serve it.

    For statements that name their jobs by id, so the primary key finds them. Through the
    (consumer, status) index an ack read every entry of that status left since the last
    vacuum, dead ones included: its time grew linearly with the jobs acked before it.
    """
    return (job.c.status + literal_column("''")) == literal_column(f"'{JobStatus(status).value}'")


def status_in(*statuses: str) -> ColumnElement[bool]:
    return or_(*(status_is(s) for s in statuses))


@dataclass(frozen=True, slots=True)
class FinishedJobs:
    """Which DEAD or DELIVERED jobs of a consumer: by the time they reached that status, by id
    range (a redrive's position and the highest id when it began), at most `limit`."""

    status: str
    changed_since: datetime | None = None
    changed_until: datetime | None = None
    after_id: int = 0
    up_to_id: int | None = None
    limit: int | None = None

    def where(self) -> list[ColumnElement[bool]]:
        where = [status_is(self.status)]
        if self.after_id:
            where.append(job.c.id > self.after_id)
        if self.up_to_id is not None:
            where.append(job.c.id <= self.up_to_id)
        if self.changed_since is not None:
            where.append(job.c.status_changed_at >= self.changed_since)
        if self.changed_until is not None:
            where.append(job.c.status_changed_at < self.changed_until)
        return where


def job_from_row(row: Row[Any]) -> Job:
    return Job(
        id=row.id,
        message_pk=row.message_pk,
        consumer_pk=row.consumer_pk,
        status=JobStatus(row.status),
        priority=row.priority,
        attempt=row.attempt,
        retry_count=row.retry_count,
        incremental_timeout=row.incremental_timeout,
        lease_expires_at=row.lease_expires_at,
        earliest_next_attempt_at=row.earliest_next_attempt_at,
        status_changed_at=row.status_changed_at,
        created_at=row.created_at,
        dead_reason=row.dead_reason,
        last_error=row.last_error,
    )


@dataclass(frozen=True, slots=True)
class QueueStats:
    due: int
    due_bytes: int
    next_due_at: datetime | None
    inflight: int


def backoff_expr(policy: RetryPolicy, retry: ColumnElement[Any]) -> ColumnElement[Any]:
    """SQL form of RetryPolicy.backoff for the retry number `retry` (1-based)."""
    delays = policy.backoff_delays
    last = len(delays)
    linear = (retry - last + 1) * delays[-1]
    if last == 1:
        return linear
    early = case({k: delays[k - 1] for k in range(1, last)}, value=retry, else_=delays[0])
    return case((retry < last, early), else_=linear)


class JobStore:
    def __init__(self, tx: Tx) -> None:
        self._tx = tx
        self._now = now(tx.dialect)

    def _lease(self, seconds: ColumnElement[Any] | int | float) -> ColumnElement[Any]:
        return plus_seconds(self._tx.dialect, self._now, seconds)

    # -- claim ---------------------------------------------------------------------------------

    async def claim_sqlite(
        self,
        consumer_pks: Sequence[int],
        *,
        limit: int,
        ack_wait: int,
        incremental_timeout: int,
        max_bytes: int | None,
    ) -> tuple[int, list[ClaimedJob]]:
        """SQLite's claim (PostgreSQL's is app/store/queue.py's text): how many jobs were due up
        to `limit`, and the leased ones, highest priority first, oldest first within one."""
        due_rows = (
            await self._tx.conn.execute(
                select(job.c.id, job.c.payload_size)
                .where(
                    job.c.consumer_pk.in_(consumer_pks),
                    status_is(QUEUED),
                    job.c.earliest_next_attempt_at <= self._now,
                )
                .order_by(job.c.priority.desc(), job.c.id)
                .limit(limit)
            )
        ).all()
        ids = (
            [row.id for row in due_rows]
            if max_bytes is None
            else _within_bytes(due_rows, max_bytes)
        )
        if not ids:
            return len(due_rows), []
        claim_jobs = (
            update(job)
            .where(job.c.id.in_(ids), status_is(QUEUED))
            .values(
                status=INFLIGHT,
                attempt=job.c.attempt + 1,
                incremental_timeout=incremental_timeout,
                lease_expires_at=self._lease(ack_wait + incremental_timeout),
                claimed_at=self._now,
                status_changed_at=self._now,
            )
            .returning(*RETURNED)
        )
        jobs = [job_from_row(row) for row in await self._tx.conn.execute(claim_jobs)]
        jobs.sort(key=lambda j: (-j.priority, j.id))
        messages = await self._messages({j.message_pk for j in jobs})
        return len(due_rows), [ClaimedJob(j, messages[j.message_pk]) for j in jobs]

    async def inflight_locked(self, consumer_pk: int) -> int:
        """In-flight count under the consumer row's lock, so max-ack-pending holds under races.

        FOR NO KEY UPDATE (key_share): claims of one consumer queue up behind each other, but
        publishers, whose job inserts take FOR KEY SHARE on the consumer row, do not wait.
        """
        await self._tx.conn.execute(
            select(consumer.c.pk)
            .where(consumer.c.pk == consumer_pk)
            .with_for_update(key_share=True)
        )
        count = select(func.count()).where(job.c.consumer_pk == consumer_pk, status_is(INFLIGHT))
        return int((await self._tx.conn.execute(count)).scalar_one())

    async def _messages(self, pks: Iterable[int]) -> dict[int, Message]:
        pks = list(pks)
        if not pks:
            return {}
        rows = await self._tx.conn.execute(select(message).where(message.c.pk.in_(pks)))
        return {row.pk: message_from_row(row) for row in rows}

    async def next_due(self, consumer_pks: Sequence[int]) -> datetime | None:
        """When the earliest queued job of these consumers falls due (None: nothing queued)."""
        query = select(func.min(job.c.earliest_next_attempt_at)).where(
            job.c.consumer_pk.in_(consumer_pks), status_is(QUEUED)
        )
        value: datetime | None = (await self._tx.conn.execute(query)).scalar_one()
        return value

    async def due_count(self, consumer_pk: int, cap: int) -> int:
        """Due queued jobs of the consumer, counted up to `cap`.

        The cap keeps this off the backlog's size: an exact count of millions of queued
        jobs on every pull would cost more than the claim itself.
        """
        if self._tx.dialect == "postgresql":
            # The claim's own count (migration 0010_claim_functions): walked in the claim
            # index's order whatever the statistics expect.
            ahead = select(func.due_jobs_ahead(consumer_pk, cap))
            return int((await self._tx.conn.execute(ahead)).scalar_one())
        due = (
            select(job.c.id)
            .where(
                job.c.consumer_pk == consumer_pk,
                status_is(QUEUED),
                job.c.earliest_next_attempt_at <= self._now,
            )
            # SQLite: the claim's order, so that the walk of ix_job_claim stops after `cap`
            # rows instead of counting the consumer's whole backlog first.
            .order_by(job.c.priority.desc(), job.c.id)
            .limit(cap)
            .subquery()
        )
        query = select(func.count()).select_from(due)
        return int((await self._tx.conn.execute(query)).scalar_one())

    async def inflight_count(self, consumer_pk: int, cap: int) -> int:
        """In-flight jobs of the consumer, counted up to `cap` (an index range scan of at
        most `cap` entries of ix_job_consumer_status)."""
        inflight = (
            select(job.c.id)
            .where(job.c.consumer_pk == consumer_pk, status_is(INFLIGHT))
            .limit(cap)
            .subquery()
        )
        query = select(func.count()).select_from(inflight)
        return int((await self._tx.conn.execute(query)).scalar_one())

    async def stats(self, consumer_pk: int) -> QueueStats:
        """Due queued jobs (count and bytes), when the next one falls due, and in-flight count."""
        is_due = job.c.earliest_next_attempt_at <= self._now
        queued = status_is(QUEUED)
        query = select(
            func.count().filter(queued, is_due),
            func.coalesce(func.sum(job.c.payload_size).filter(queued, is_due), 0),
            func.min(job.c.earliest_next_attempt_at).filter(queued),
            func.count().filter(status_is(INFLIGHT)),
        ).where(job.c.consumer_pk == consumer_pk, status_in(QUEUED, INFLIGHT))
        due, due_bytes, next_due, inflight = (await self._tx.conn.execute(query)).one()
        return QueueStats(int(due), int(due_bytes), next_due, int(inflight))

    # -- reads ---------------------------------------------------------------------------------

    async def get(self, job_id: int, consumer_pk: int | None = None) -> Job | None:
        query = select(job).where(job.c.id == job_id)
        if consumer_pk is not None:
            query = query.where(job.c.consumer_pk == consumer_pk)
        row = (await self._tx.conn.execute(query)).first()
        return job_from_row(row) if row else None

    async def many(self, job_ids: Sequence[int], consumer_pk: int) -> list[Job]:
        query = select(job).where(job.c.id.in_(job_ids), job.c.consumer_pk == consumer_pk)
        return [job_from_row(row) for row in await self._tx.conn.execute(query)]

    async def get_with_message(self, job_id: int, consumer_pk: int) -> ClaimedJob | None:
        found = await self.get(job_id, consumer_pk)
        if found is None:
            return None
        messages = await self._messages([found.message_pk])
        return ClaimedJob(found, messages[found.message_pk])

    async def for_message(self, message_pk: int) -> list[Job]:
        rows = await self._tx.conn.execute(
            select(job).where(job.c.message_pk == message_pk).order_by(job.c.id)
        )
        return [job_from_row(row) for row in rows]

    async def queued(self, consumer_pk: int, cursor: Cursor, limit: int) -> Page[ClaimedJob]:
        """Due queued jobs in delivery order, keyset-paginated on (priority desc, id)."""
        query = select(job).where(
            job.c.consumer_pk == consumer_pk,
            status_is(QUEUED),
            job.c.earliest_next_attempt_at <= self._now,
        )
        if cursor.next is not None:
            priority, last_id = _split_key(decode_cursor(cursor.next))
            query = query.where(
                or_(
                    job.c.priority < priority,
                    and_(job.c.priority == priority, job.c.id > last_id),
                )
            )
        query = query.order_by(job.c.priority.desc(), job.c.id).limit(limit + 1)
        rows = (await self._tx.conn.execute(query)).all()
        jobs = [job_from_row(row) for row in rows[:limit]]
        messages = await self._messages({j.message_pk for j in jobs})
        next_cursor = None
        if len(rows) > limit and jobs:
            next_cursor = encode_cursor(f"{jobs[-1].priority}:{jobs[-1].id}")
        return Page([ClaimedJob(j, messages[j.message_pk]) for j in jobs], next_cursor)

    async def dead(self, consumer_pk: int, cursor: Cursor, limit: int) -> Page[Job]:
        query = select(job).where(job.c.consumer_pk == consumer_pk, status_is(DEAD))
        if cursor.next is not None:
            query = query.where(job.c.id > _cursor_int(decode_cursor(cursor.next)))
        rows = (await self._tx.conn.execute(query.order_by(job.c.id).limit(limit + 1))).all()
        jobs = [job_from_row(row) for row in rows[:limit]]
        next_cursor = encode_cursor(jobs[-1].id) if len(rows) > limit and jobs else None
        return Page(jobs, next_cursor)

    # -- transitions ---------------------------------------------------------------------------

    async def _transition(
        self, where: Sequence[ColumnElement[bool]], values: dict[str, Any]
    ) -> list[Job]:
        values.setdefault("status_changed_at", self._now)
        query = update(job).where(*where).values(**values).returning(*RETURNED)
        return [job_from_row(row) for row in await self._tx.conn.execute(query)]

    async def start(
        self,
        job_id: int,
        consumer_pk: int,
        from_status: JobStatus,
        *,
        ack_wait: int,
        incremental_timeout: int | None,
    ) -> Job | None:
        """Seed API: QUEUED or DEAD -> INFLIGHT (from DEAD counts as a retry). Without an
        IncrementalTimeout the job keeps the one it has, as the Go original does (it writes the
        stored value back), and its lease counts it."""
        timeout: ColumnElement[Any] | int = (
            job.c.incremental_timeout if incremental_timeout is None else incremental_timeout
        )
        values: dict[str, Any] = {
            "status": INFLIGHT,
            "attempt": job.c.attempt + 1,
            "lease_expires_at": self._lease(ack_wait + timeout),
            "claimed_at": self._now,
        }
        if incremental_timeout is not None:
            values["incremental_timeout"] = incremental_timeout
        if from_status is JobStatus.DEAD:
            values["retry_count"] = job.c.retry_count + 1
            values["dead_reason"] = None
        running = select(consumer.c.pk).where(
            consumer.c.pk == consumer_pk, not_paused(self._tx.dialect)
        )
        found = await self._transition(
            [
                job.c.id == job_id,
                job.c.consumer_pk == consumer_pk,
                job.c.status == from_status.value,
                # The claims' rule: nothing of a paused consumer is leased.
                exists(running),
            ],
            values,
        )
        return found[0] if found else None

    async def complete(
        self,
        consumer_pk: int,
        targets: Sequence[tuple[int, int | None]],
        status: JobStatus,
        reason: str | None = None,
        *,
        note: str | None = None,
    ) -> list[Job]:
        """INFLIGHT -> DELIVERED or DEAD for (job id, attempt or None) pairs of one consumer;
        `note` (attempts.note) says how the attempt ended (default: an ack, or a term)."""
        if note is None:
            done = status is JobStatus.DELIVERED
            note = attempts.ACKED if done else attempts.note("term", error=reason)
        values: dict[str, Any] = {
            "status": status.value,
            "lease_expires_at": None,
            "attempts": attempts.appended(self._tx.dialect, note),
        }
        if status is JobStatus.DEAD:
            values["dead_reason"] = reason
        return await self._transition(self._inflight(consumer_pk, targets), values)

    async def fail(
        self,
        consumer_pk: int,
        targets: Sequence[tuple[int, int | None]],
        policy: RetryPolicy,
        *,
        delay: float | None = None,
        reason: str,
        last_error: str | None = None,
        counted: bool = True,
        note: str | None = None,
    ) -> list[Job]:
        """INFLIGHT -> QUEUED, retry + 1, due after `delay` or the backoff; DEAD when exhausted.
        Not `counted` (a job handed back unprocessed): QUEUED, due after `delay` or at once,
        the retries untouched."""
        if counted:
            values = self._failure_values(policy, delay, reason)
        else:
            values = {
                "status": QUEUED,
                "earliest_next_attempt_at": self._lease(delay or 0),
                "lease_expires_at": None,
            }
        if last_error is not None:
            values["last_error"] = last_error
        # A nak unless the caller says otherwise (a push's failure, a hand-back).
        values["attempts"] = attempts.appended(self._tx.dialect, note or NAKED)
        return await self._transition(self._inflight(consumer_pk, targets), values)

    def _failure_values(
        self, policy: RetryPolicy, delay: float | None, reason: str
    ) -> dict[str, Any]:
        exhausted = job.c.retry_count >= _retries_allowed(policy)
        wait: ColumnElement[Any] | float = (
            backoff_expr(policy, job.c.retry_count + 1) if delay is None else delay
        )
        return {
            "status": case((exhausted, literal(DEAD)), else_=literal(QUEUED)),
            "retry_count": case((exhausted, job.c.retry_count), else_=job.c.retry_count + 1),
            "earliest_next_attempt_at": case(
                (exhausted, job.c.earliest_next_attempt_at), else_=self._lease(wait)
            ),
            "dead_reason": case((exhausted, literal(reason)), else_=job.c.dead_reason),
            "lease_expires_at": None,
        }

    async def extend(
        self, consumer_pk: int, targets: Sequence[tuple[int, int | None]], ack_wait: int
    ) -> list[Job]:
        """In progress: push the lease forward from now by the lease the job was given, the ack
        wait plus the job's IncrementalTimeout (the seed spec's stopTimeout + rationalDelay +
        incrementalTimeout): a job leased for 600 s keeps 600 s, not the bare ack wait."""
        return await self._transition(
            self._inflight(consumer_pk, targets),
            {
                "lease_expires_at": self._lease(ack_wait + job.c.incremental_timeout),
                "status_changed_at": job.c.status_changed_at,
            },
        )

    def _inflight(
        self, consumer_pk: int, targets: Sequence[tuple[int, int | None]]
    ) -> list[ColumnElement[bool]]:
        if self._tx.dialect == "postgresql":
            # One (id, attempt) array pair joined with UPDATE ... FROM: the statement text is the
            # same for every batch size, and each row is found through the primary key. A NULL
            # attempt means "any attempt" (an ack that names none).
            given = (
                func.unnest(
                    bindparam("ack_ids", [i for i, _ in targets], type_=ARRAY(BigInteger())),
                    bindparam("ack_attempts", [a for _, a in targets], type_=ARRAY(Integer())),
                )
                .table_valued("id", "attempt")
                .render_derived(name="acked")
            )
            return [
                job.c.id == given.c.id,
                or_(given.c.attempt.is_(None), job.c.attempt == given.c.attempt),
                job.c.consumer_pk == consumer_pk,
                status_by_key(INFLIGHT),
            ]
        fenced = [(i, a) for i, a in targets if a is not None]
        loose = [i for i, a in targets if a is None]
        matches: list[ColumnElement[bool]] = []
        if fenced:
            matches.append(tuple_(job.c.id, job.c.attempt).in_(fenced))
        if loose:
            matches.append(job.c.id.in_(loose))
        return [job.c.consumer_pk == consumer_pk, status_is(INFLIGHT), or_(*matches)]

    async def requeue_dead(self, consumer_pk: int, job_id: int | None = None) -> list[Job]:
        """DEAD -> QUEUED with a fresh retry budget (one job, or the consumer's whole DLQ)."""
        return await self.requeue_finished(consumer_pk, FinishedJobs(DEAD), job_id=job_id)

    async def requeue_finished(
        self, consumer_pk: int, which: FinishedJobs, *, job_id: int | None = None
    ) -> list[Job]:
        """DEAD (or DELIVERED, to replay) -> QUEUED with a fresh retry budget: one job, all of
        them, or a redrive's chunk (the first `limit` by id after `after_id`)."""
        where = [job.c.consumer_pk == consumer_pk, *which.where()]
        if job_id is not None:
            where.append(job.c.id == job_id)
        if which.limit is not None:
            chunk = select(job.c.id).where(*where).order_by(job.c.id).limit(which.limit)
            where = [job.c.id.in_(chunk.scalar_subquery()), status_is(which.status)]
        return await self._transition(
            where,
            {
                "status": QUEUED,
                "retry_count": 0,
                "earliest_next_attempt_at": self._now,
                "dead_reason": None,
            },
        )

    async def count_finished(self, consumer_pk: int, which: FinishedJobs) -> int:
        query = select(func.count()).where(job.c.consumer_pk == consumer_pk, *which.where())
        return int((await self._tx.conn.execute(query)).scalar_one())

    async def delete_dead(self, consumer_pk: int, job_id: int) -> bool:
        result = await self._tx.conn.execute(
            delete(job).where(job.c.id == job_id, job.c.consumer_pk == consumer_pk, status_is(DEAD))
        )
        await LedgerStore(self._tx).removed({consumer_pk: result.rowcount})
        return bool(result.rowcount)

    async def purge_dead(self, consumer_pk: int) -> int:
        """Every DEAD job of the consumer, deleted."""
        result = await self._tx.conn.execute(
            delete(job).where(job.c.consumer_pk == consumer_pk, status_is(DEAD))
        )
        await LedgerStore(self._tx).removed({consumer_pk: result.rowcount})
        return int(result.rowcount or 0)

    # -- sweep ---------------------------------------------------------------------------------

    async def requeue_expired(self, policy: RetryPolicy, batch: int) -> list[Job]:
        """Expired leases back to QUEUED (retry + 1, due at once), or DEAD once retries are
        used up.

        No backoff here: the lease was the wait, as a JetStream ack wait or an SQS visibility
        timeout is; a worker that names its failure (nak) gets the backoff. The oldest `batch`
        expired leases are locked with SKIP LOCKED, so sweepers running side by side split the
        work instead of repeating it.
        """
        expired = (
            select(job.c.id)
            .where(status_is(INFLIGHT), job.c.lease_expires_at < self._now)
            .order_by(job.c.lease_expires_at)
            .limit(batch)
            .with_for_update(skip_locked=True)
        )
        values = self._failure_values(policy, 0, "lease expired with no retries left")
        values["timeout_count"] = job.c.timeout_count + 1
        values["attempts"] = attempts.appended(self._tx.dialect, EXPIRED)
        return await self._transition(
            [job.c.id.in_(expired.scalar_subquery()), status_is(INFLIGHT)], values
        )

    async def next_lease_end(self) -> datetime | None:
        """When the earliest lease still running ends (None: nothing in flight); one probe of
        the sweep index."""
        query = select(func.min(job.c.lease_expires_at)).where(status_is(INFLIGHT))
        value: datetime | None = (await self._tx.conn.execute(query)).scalar_one()
        return value


# No consumer sets more deliveries than this (its max_deliver is an INTEGER column).
_UNLIMITED_RETRIES = 2**31 - 1


def _retries_allowed(policy: RetryPolicy) -> ColumnElement[Any]:
    """The retries the job's consumer allows: its own max_deliver less the first delivery
    (-1: no limit, as JetStream's), or the broker's max-retry when it sets none."""
    own = select(consumer.c.max_deliver).where(consumer.c.pk == job.c.consumer_pk).scalar_subquery()
    return case(
        (own.is_(None), literal(policy.max_retry)),
        (own < 0, literal(_UNLIMITED_RETRIES)),
        else_=own - 1,
    )


def _within_bytes(rows: Sequence[Row[Any, Any]], max_bytes: int) -> list[int]:
    """The longest prefix whose payloads fit in max_bytes (always at least one job)."""
    chosen: list[int] = []
    total = 0
    for row in rows:
        if chosen and total + row.payload_size > max_bytes:
            break
        if not chosen and row.payload_size > max_bytes:
            return [row.id]
        total += row.payload_size
        chosen.append(row.id)
    return chosen


def _split_key(raw: str) -> tuple[int, int]:
    priority, sep, last_id = raw.partition(":")
    if not sep:
        raise InvalidInput("malformed pagination cursor")
    return _cursor_int(priority, bits=32), _cursor_int(last_id)


def _cursor_int(raw: str, bits: int = 64) -> int:
    """An integer from a cursor that fits its column (cursors come from clients, maybe forged)."""
    try:
        value = int(raw)
    except ValueError:
        raise InvalidInput("malformed pagination cursor") from None
    if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
        raise InvalidInput("malformed pagination cursor")
    return value
