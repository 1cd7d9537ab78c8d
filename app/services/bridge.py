"""Use cases of the NATS bridge, one transaction each, on the shared claim and ack statements.

A pull request becomes JobStore.claim (the same statement as the HTTP pull API) plus delivery
sequence numbers; an ack becomes DeliveryService.apply_acks (the same conditional UPDATEs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from app.domain.jobs import AckType, JobStatus, RetryPolicy
from app.domain.models import Consumer, Job, PulledJob
from app.services.delivery import AckItem, AckOutcome, DeliveryService
from app.store import hotpath
from app.store.bridge import BridgeStore, DeliveryState
from app.store.db import Database
from app.store.jobs import JobStore, QueueStats
from app.store.stakeholders import ConsumerStore, channels

# The `pending` token of ack subjects (nats-py `num_pending`) is exact up to this many due
# jobs; counting a deep backlog exactly on every claim would cost more than the claim.


class Delivery(NamedTuple):
    """One claimed job on its way to a requester."""

    job: PulledJob
    seq: int  # the delivery (consumer) sequence number
    pending: int  # due jobs not yet delivered after this one


@dataclass(frozen=True, slots=True)
class ClaimBatch:
    deliveries: list[Delivery]
    due: int  # due jobs left after the claim, counted up to PENDING_COUNT_CAP
    next_due_at: datetime | None  # when nothing is due: when the next job falls due
    last_seq: int
    last_stream_seq: int


@dataclass(frozen=True, slots=True)
class Lookup:
    channel_found: bool
    consumer: Consumer | None


@dataclass(frozen=True, slots=True)
class AckResult:
    outcomes: list[AckOutcome]
    dead: list[Job]  # jobs a NAK sent to the dead letters (retries used up)


@dataclass(frozen=True, slots=True)
class ConsumerSnapshot:
    consumer: Consumer
    stats: QueueStats
    state: DeliveryState


def _numbered(
    claimed: list[PulledJob], due: int, next_due_at: datetime | None, seqs: list[int]
) -> ClaimBatch:
    count = len(claimed)
    deliveries = [
        Delivery(job, seq, due + count - 1 - index)
        for index, (job, seq) in enumerate(zip(claimed, seqs, strict=True))
    ]
    return ClaimBatch(
        deliveries,
        due,
        next_due_at,
        seqs[-1] if seqs else 0,
        max((job.id for job in claimed), default=0),
    )


class BridgeService:
    def __init__(self, db: Database, delivery: DeliveryService, policy: RetryPolicy) -> None:
        self._db = db
        self._delivery = delivery
        self._policy = policy

    @property
    def policy(self) -> RetryPolicy:
        return self._policy

    def ack_wait(self, consumer: Consumer) -> int:
        return self._delivery.ack_wait(consumer)

    async def lookup(self, channel_id: str, consumer_id: str) -> Lookup:
        async with self._db.transaction() as tx:
            if await channels(tx).get(channel_id) is None:
                return Lookup(False, None)
            return Lookup(True, await ConsumerStore(tx).get(channel_id, consumer_id))

    async def channel_ids(self) -> list[str]:
        async with self._db.transaction() as tx:
            return await BridgeStore(tx).channel_ids()

    async def claim(
        self, consumer: Consumer, limit: int, max_bytes: int | None = None
    ) -> ClaimBatch:
        """Lease up to `limit` jobs with the shared claim statement and number the deliveries."""
        if (
            self._db.dialect == "postgresql"
            and max_bytes is None
            and consumer.max_ack_pending is None
        ):
            quick = await hotpath.claim(
                self._db,
                hotpath.Named(consumer.pk),
                limit=limit,
                default_ack_wait=self._delivery.ack_wait(consumer),
                numbered=True,
            )
            if quick.jobs:
                return _numbered(quick.jobs, quick.pending, None, quick.seqs)
        async with self._db.transaction() as tx:
            jobs = JobStore(tx)
            claimed = await jobs.claim(
                consumer.pk,
                limit=limit,
                ack_wait=self._delivery.ack_wait(consumer),
                max_bytes=max_bytes,
                max_ack_pending=consumer.max_ack_pending,
            )
            bridge = BridgeStore(tx)
            due, next_due_at = await jobs.left_after_claim(
                consumer.pk,
                claimed=len(claimed),
                limit=limit,
                max_bytes=max_bytes,
                max_ack_pending=consumer.max_ack_pending,
            )
            seqs = await bridge.next_delivery_seqs(len(claimed))
            if claimed:
                await bridge.record_delivery(consumer.pk, seqs[-1], max(c.job.id for c in claimed))
        return _numbered([PulledJob.of(c) for c in claimed], due, next_due_at, seqs)

    async def release(self, consumer: Consumer, targets: Sequence[tuple[int, int]]) -> None:
        """Give back claims nobody received (no retry counted); other pullers are woken."""
        if not targets:
            return
        async with self._db.transaction() as tx:
            if await BridgeStore(tx).release(consumer.pk, targets):
                tx.announce([consumer.pk])

    async def acks(self, consumer: Consumer, items: Sequence[AckItem]) -> AckResult:
        """The shared ack statements; also reports which NAKs dead-lettered their job."""
        acked = await self._delivery.plain_acks(hotpath.Named(consumer.pk), items)
        rest = [item for item in items if item.id not in acked]
        outcomes: list[AckOutcome] = []
        dead: list[Job] = []
        if rest:
            async with self._db.transaction() as tx:
                outcomes = await self._delivery.apply_acks(tx, consumer, rest)
                naked = [
                    o.id
                    for o, item in zip(outcomes, rest, strict=True)
                    if o.status == 202 and item.type is AckType.NAK
                ]
                if naked:
                    dead = [
                        j
                        for j in await JobStore(tx).many(naked, consumer.pk)
                        if j.status is JobStatus.DEAD
                    ]
        explained = iter(outcomes)
        return AckResult(
            [AckOutcome(item.id, 202) if item.id in acked else next(explained) for item in items],
            dead,
        )

    async def snapshot(self, consumer: Consumer) -> ConsumerSnapshot:
        async with self._db.transaction() as tx:
            stats = await JobStore(tx).stats(consumer.pk)
            state = await BridgeStore(tx).delivery_state(consumer.pk)
        return ConsumerSnapshot(consumer, stats, state)

    async def last_delivery(self, consumer: Consumer) -> tuple[int, int]:
        async with self._db.transaction() as tx:
            return await BridgeStore(tx).last_sequences(consumer.pk)
