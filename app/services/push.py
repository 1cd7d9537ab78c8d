"""Push delivery use cases: claim due jobs of push consumers, record each outcome."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from app.domain.jobs import JobStatus, RetryPolicy
from app.domain.models import Consumer, PulledJob
from app.store.db import Database
from app.store.jobs import JobStore
from app.store.queue import Named, Queue
from app.store.stakeholders import ConsumerStore


@dataclass(frozen=True, slots=True)
class PushJob:
    """A leased job with the consumer it must be POSTed to."""

    job: PulledJob
    consumer: Consumer


@dataclass(frozen=True, slots=True)
class PushClaim:
    jobs: list[PushJob]
    next_due_at: datetime | None


class PushService:
    def __init__(self, db: Database, queue: Queue, policy: RetryPolicy, lease_seconds: int) -> None:
        self._db = db
        self._queue = queue
        self._policy = policy
        self._lease = lease_seconds

    async def claim(self, limit: int) -> PushClaim:
        """Lease up to `limit` due jobs across all push consumers, highest priority first."""
        async with self._db.transaction() as tx:
            consumers = {c.pk: c for c in await ConsumerStore(tx).push_consumers()}
        if not consumers:
            return PushClaim([], None)
        claimed = await self._queue.claim(
            Named.push(list(consumers)), limit=limit, default_ack_wait=self._lease
        )
        next_due = None
        if len(claimed.jobs) < limit:
            async with self._db.transaction() as tx:
                next_due = await JobStore(tx).next_due(list(consumers))
        jobs = [
            PushJob(job, consumers[job.consumer_pk])
            for job in claimed.jobs
            if job.consumer_pk in consumers
        ]
        return PushClaim(jobs, next_due)

    async def delivered(self, jobs: Sequence[PushJob]) -> int:
        """Record 2xx answers, one transaction for all; returns how many jobs moved. A job
        whose lease was lost meanwhile (swept, now another delivery's) is left alone."""
        targets: defaultdict[Consumer, list[tuple[int, int | None]]] = defaultdict(list)
        for job in jobs:
            targets[job.consumer].append((job.job.id, job.job.attempt))
        moved = 0
        async with self._db.transaction() as tx:
            for consumer, pairs in targets.items():
                named = Named(consumer.pk, type=consumer.type)
                moved += len(await self._queue.ack(named, pairs, tx))
        return moved

    async def failed(self, job: PushJob, error: str) -> JobStatus | None:
        """Record a failed attempt: requeued with backoff, or dead once retries are used up."""
        async with self._db.transaction() as tx:
            moved = await JobStore(tx).fail(
                job.consumer.pk,
                [(job.job.id, job.job.attempt)],
                self._policy,
                reason=f"delivery failed after the last retry: {error}",
                last_error=error,
            )
            if moved and moved[0].status is JobStatus.QUEUED:
                tx.announce([job.consumer.pk])
        return moved[0].status if moved else None
