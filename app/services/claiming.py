"""What the pull scheduler serves waiting requests from: the Queue's claim statement run with
a consumer's terms, the give-back of claims nobody received, and a fresh look at the
consumer when a claim found nothing."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from app.domain import advisories
from app.domain.models import Consumer
from app.domain.pulls import ClaimBatch
from app.services.advisories import Advisories
from app.services.pausing import pause_end
from app.store.bridge import BridgeStore
from app.store.db import Database
from app.store.jobs import JobStore
from app.store.pins import PinStore
from app.store.queue import Named, Queue
from app.store.stakeholders import ConsumerStore


class ClaimSource:
    def __init__(
        self,
        db: Database,
        queue: Queue,
        default_ack_wait: int,
        advisories: Advisories | None = None,
    ) -> None:
        self._db = db
        self._queue = queue
        self._default_ack_wait = default_ack_wait
        self._advisories = advisories or Advisories()

    @property
    def default_ack_wait(self) -> int:
        return self._default_ack_wait

    def ack_wait(self, consumer: Consumer) -> int:
        return consumer.ack_wait(self._default_ack_wait)

    async def claim(
        self,
        consumer: Consumer,
        limit: int,
        *,
        numbered: bool,
        max_bytes: int | None = None,
        incremental_timeout: int = 0,
    ) -> ClaimBatch:
        """Lease up to `limit` jobs with the shared claim statement; numbered claims give each
        delivery the consumer's next sequence number (the NATS bridge's)."""
        claimed = await self._queue.claim(
            Named(consumer.pk),
            limit=limit,
            default_ack_wait=self._default_ack_wait,
            incremental_timeout=incremental_timeout,
            max_bytes=max_bytes,
            max_ack_pending=consumer.max_ack_pending,
            numbered=numbered,
        )
        return ClaimBatch.numbered(claimed.jobs, claimed.pending, claimed.seqs)

    async def release(
        self, consumer_pk: int, targets: Sequence[tuple[int, int]], *, sent: bool = False
    ) -> None:
        """Give back claims nobody received (no retry counted); other pullers are woken."""
        if not targets:
            return
        async with self._db.transaction() as tx:
            if await BridgeStore(tx).release(consumer_pk, targets, sent=sent):
                tx.announce([consumer_pk])

    async def recheck(
        self, consumer_pk: int, *, next_due: bool
    ) -> tuple[Consumer | None, datetime | None]:
        """The consumer as it is now (None: deleted), and, when asked, when its next queued
        job falls due (None: nothing queued)."""
        async with self._db.transaction() as tx:
            fresh = await ConsumerStore(tx).get_by_pk(consumer_pk)
            due = await JobStore(tx).next_due([consumer_pk]) if next_due and fresh else None
        if fresh is not None and fresh.paused_at(datetime.now(UTC)):
            # Its claims find nothing until the pause ends: the waiters sleep until then (or
            # until the resume's announcement), not until jobs already due.
            due = pause_end(fresh)
        return fresh, due

    async def backlog(self, consumer_pk: int, pending_cap: int, ack_cap: int) -> tuple[int, int]:
        """The consumer's due jobs and jobs in flight, each counted up to its cap (what
        overflow requests wait for; the caps keep the counts off a deep backlog's size)."""
        async with self._db.transaction() as tx:
            store = JobStore(tx)
            pending = await store.due_count(consumer_pk, pending_cap) if pending_cap else 0
            inflight = await store.inflight_count(consumer_pk, ack_cap) if ack_cap else 0
        return pending, inflight

    async def pin(self, consumer_pk: int) -> str | None:
        """The pin of a pinned_client consumer's group (None: nobody holds it)."""
        async with self._db.transaction() as tx:
            found = await PinStore(tx).current(consumer_pk)
        return found.pinned_id if found else None

    async def touch_pin(self, consumer_pk: int, pin_id: str) -> bool:
        """The pinned client pulled again (False: the pin is not its)."""
        async with self._db.transaction() as tx:
            return await PinStore(tx).touch(consumer_pk, pin_id)

    async def assign_pin(self, consumer: Consumer, pin_id: str) -> bool:
        """Pin the group to `pin_id` unless another process pinned it first."""
        assert consumer.priority.group is not None
        async with self._db.transaction() as tx:
            assigned = await PinStore(tx).assign(consumer.pk, consumer.priority.group, pin_id)
        if assigned:
            await self._advisories.emit(advisories.pinned(consumer, pin_id))
        return assigned

    async def last_delivery(self, consumer_pk: int) -> tuple[int, int]:
        """The consumer's last delivery sequence and last job id handed out (0, 0 before)."""
        async with self._db.transaction() as tx:
            return await BridgeStore(tx).last_sequences(consumer_pk)
