"""Push delivery use cases: claim due jobs of push consumers, record each outcome."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select

from app.domain.jobs import JobStatus, RetryPolicy
from app.domain.models import ClaimedJob, Consumer, ConsumerType
from app.store.db import Database
from app.store.jobs import JobStore
from app.store.schema import consumer as consumer_table
from app.store.stakeholders import consumer_from_row


@dataclass(frozen=True, slots=True)
class PushJob:
    """A leased job with the consumer it must be POSTed to."""

    claimed: ClaimedJob
    consumer: Consumer


@dataclass(frozen=True, slots=True)
class PushClaim:
    jobs: list[PushJob]
    next_due_at: datetime | None


class PushService:
    def __init__(self, db: Database, policy: RetryPolicy, lease_seconds: int) -> None:
        self._db = db
        self._policy = policy
        self._lease = lease_seconds

    async def claim(self, limit: int) -> PushClaim:
        """Lease up to `limit` due jobs across all push consumers, highest priority first."""
        async with self._db.transaction() as tx:
            rows = await tx.conn.execute(
                select(consumer_table).where(consumer_table.c.type == ConsumerType.PUSH.value)
            )
            consumers = {row.pk: consumer_from_row(row) for row in rows}
            if not consumers:
                return PushClaim([], None)
            store = JobStore(tx)
            claimed = await store.claim(list(consumers), limit=limit, ack_wait=self._lease)
            next_due = None
            if len(claimed) < limit:
                next_due = await store.next_due(list(consumers))
        jobs = [PushJob(c, consumers[c.job.consumer_pk]) for c in claimed]
        return PushClaim(jobs, next_due)

    async def delivered(self, jobs: Sequence[PushJob]) -> int:
        """Record 2xx answers, one transaction for all; returns how many jobs moved. A job
        whose lease was lost meanwhile (swept, now another delivery's) is left alone."""
        targets: defaultdict[int, list[tuple[int, int | None]]] = defaultdict(list)
        for job in jobs:
            targets[job.consumer.pk].append((job.claimed.job.id, job.claimed.job.attempt))
        moved = 0
        async with self._db.transaction() as tx:
            store = JobStore(tx)
            for consumer_pk, pairs in targets.items():
                moved += len(await store.complete(consumer_pk, pairs, JobStatus.DELIVERED))
        return moved

    async def failed(self, job: PushJob, error: str) -> JobStatus | None:
        """Record a failed attempt: requeued with backoff, or dead once retries are used up."""
        async with self._db.transaction() as tx:
            moved = await JobStore(tx).fail(
                job.consumer.pk,
                [(job.claimed.job.id, job.claimed.job.attempt)],
                self._policy,
                reason=f"delivery failed after the last retry: {error}",
                last_error=error,
            )
            if moved and moved[0].status is JobStatus.QUEUED:
                tx.announce([job.consumer.pk])
        return moved[0].status if moved else None
