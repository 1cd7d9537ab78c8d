"""Redrives: a consumer's DEAD (or DELIVERED) jobs moved back to QUEUED in the background, a
chunk at a time at the asked rate, cancellable, with progress (RedriveRunner drives `step`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from app.domain.errors import Conflict, NotFound
from app.domain.models import Consumer, Observe, Redrive, ignore
from app.domain.pulls import ConsumerCredentials
from app.domain.redrives import RedriveRequest
from app.services.auth import pull_consumer
from app.store.db import Database, Tx
from app.store.job_counts import JobCountStore
from app.store.jobs import FinishedJobs, JobStore
from app.store.redrives import RedriveStore

LISTED = 100  # the newest redrives a listing shows

IDLE_LOOK = 1.0  # seconds between looks for new redrives when none runs


class RedriveService:
    def __init__(self, db: Database, observe: Observe = ignore) -> None:
        self._db = db
        self._observe = observe

    async def _consumer(self, tx: Tx, creds: ConsumerCredentials) -> Consumer:
        return await pull_consumer(tx, creds, require_pull=False)  # push ones have dead letters

    async def check(self, creds: ConsumerCredentials) -> None:
        """The consumer's credentials, checked before its request body is read."""
        async with self._db.transaction() as tx:
            await self._consumer(tx, creds)

    async def start(self, creds: ConsumerCredentials, request: RedriveRequest) -> Redrive:
        async with self._db.transaction() as tx:
            consumer = await self._consumer(tx, creds)
            which = FinishedJobs(request.from_status.value, request.since, request.until)
            if request.since is None and request.until is None:
                total = await JobCountStore(tx).for_consumer(consumer.pk, which.status)
            else:
                total = await JobStore(tx).count_finished(consumer.pk, which)
            return await RedriveStore(tx).start(
                consumer.pk,
                request.from_status,
                request.since,
                request.until,
                request.per_second,
                total,
            )

    async def get(self, creds: ConsumerCredentials, redrive_id: int) -> Redrive:
        async with self._db.transaction() as tx:
            consumer = await self._consumer(tx, creds)
            found = await RedriveStore(tx).get(consumer.pk, redrive_id)
            if found is None:
                raise NotFound(f"redrive {redrive_id} not found for this consumer")
            return found

    async def list(self, creds: ConsumerCredentials) -> Sequence[Redrive]:
        async with self._db.transaction() as tx:
            consumer = await self._consumer(tx, creds)
            return await RedriveStore(tx).for_consumer(consumer.pk, LISTED)

    async def cancel(self, creds: ConsumerCredentials, redrive_id: int) -> Redrive:
        async with self._db.transaction() as tx:
            consumer = await self._consumer(tx, creds)
            store = RedriveStore(tx)
            cancelled = await store.cancel(consumer.pk, redrive_id)
            if cancelled is not None:
                return cancelled
            found = await store.get(consumer.pk, redrive_id)
            if found is None:
                raise NotFound(f"redrive {redrive_id} not found for this consumer")
            raise Conflict(
                f"redrive {redrive_id} is {found.status}; only a RUNNING one is cancelled"
            )

    async def step(self) -> float:
        """Move one due chunk of one running redrive; the seconds until the next is due."""
        async with self._db.transaction() as tx:
            store = RedriveStore(tx)
            due = await store.take_due()
            if due is None:
                next_at = await store.next_due_at()
                if next_at is None:
                    return IDLE_LOOK
                return min(IDLE_LOOK, max(0.0, (next_at - datetime.now(UTC)).total_seconds()))
            which = FinishedJobs(
                due.from_status.value,
                due.changed_since,
                due.changed_until,
                after_id=due.cursor,
                up_to_id=due.upper_id,
                limit=due.chunk,
            )
            moved = await JobStore(tx).requeue_finished(due.consumer_pk, which)
            # On after the chunk's last id; a chunk that moved nothing found none left (one
            # that moved fewer than asked may have lost some to a concurrent change).
            cursor = max((j.id for j in moved), default=due.cursor)
            done = not moved
            await store.advance(due.id, cursor, len(moved), done=done)
            if moved:
                tx.announce([due.consumer_pk])
        if moved:
            self._observe("redrive", len(moved))
        return 0.0
