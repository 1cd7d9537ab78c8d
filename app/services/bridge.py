"""Use cases of the NATS bridge, on the shared claim and ack statements.

A pull request becomes the Queue's claim (the same statement as the HTTP pull API) with its
deliveries numbered in it; acks go through AckService, as HTTP acks do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from app.domain.jobs import RetryPolicy
from app.domain.models import MAX_FIELD_LENGTH, Consumer, PulledJob
from app.domain.pulls import AckItem
from app.services.acking import AckBatch, AckService
from app.services.pulling import PullService
from app.store.bridge import BridgeStore, DeliveryState
from app.store.db import Database
from app.store.jobs import JobStore, QueueStats
from app.store.queue import Named, Queue
from app.store.stakeholders import ConsumerStore, channels


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
    def __init__(
        self, db: Database, queue: Queue, pulls: PullService, acks: AckService, policy: RetryPolicy
    ) -> None:
        self._db = db
        self._queue = queue
        self._pulls = pulls
        self._acks = acks
        self._policy = policy

    @property
    def policy(self) -> RetryPolicy:
        return self._policy

    def ack_wait(self, consumer: Consumer) -> int:
        return self._pulls.ack_wait(consumer)

    async def lookup(self, channel_id: str, consumer_id: str) -> Lookup:
        # A name no channel or consumer can have is not found, as nats-server says of a
        # stream or consumer it does not have, without asking the database (it refuses NUL).
        if not _nameable(channel_id):
            return Lookup(False, None)
        async with self._db.transaction() as tx:
            if await channels(tx).get(channel_id) is None:
                return Lookup(False, None)
            if not _nameable(consumer_id):
                return Lookup(True, None)
            return Lookup(True, await ConsumerStore(tx).get(channel_id, consumer_id))

    async def account_counts(self) -> tuple[int, int]:
        """Streams and consumers as JetStream counts them: channels, and pull consumers."""
        async with self._db.transaction() as tx:
            return await BridgeStore(tx).account_counts()

    async def channel_ids(self) -> list[str]:
        async with self._db.transaction() as tx:
            return await BridgeStore(tx).channel_ids()

    async def claim(
        self, consumer: Consumer, limit: int, max_bytes: int | None = None
    ) -> ClaimBatch:
        """Lease up to `limit` jobs with the shared claim statement, deliveries numbered."""
        claimed = await self._queue.claim(
            Named(consumer.pk),
            limit=limit,
            default_ack_wait=self._pulls.ack_wait(consumer),
            max_bytes=max_bytes,
            max_ack_pending=consumer.max_ack_pending,
            numbered=True,
        )
        next_due_at = None
        if not claimed.jobs and claimed.pending == 0:
            async with self._db.transaction() as tx:
                next_due_at = await JobStore(tx).next_due([consumer.pk])
        return _numbered(claimed.jobs, claimed.pending, next_due_at, claimed.seqs)

    async def release(self, consumer: Consumer, targets: Sequence[tuple[int, int]]) -> None:
        """Give back claims nobody received (no retry counted); other pullers are woken."""
        if not targets:
            return
        async with self._db.transaction() as tx:
            if await BridgeStore(tx).release(consumer.pk, targets):
                tx.announce([consumer.pk])

    async def acks(self, consumer: Consumer, items: Sequence[AckItem]) -> AckBatch:
        return await self._acks.ack_for(consumer, items)

    async def snapshot(self, consumer: Consumer) -> ConsumerSnapshot:
        async with self._db.transaction() as tx:
            stats = await JobStore(tx).stats(consumer.pk)
            state = await BridgeStore(tx).delivery_state(consumer.pk)
        return ConsumerSnapshot(consumer, stats, state)

    async def last_delivery(self, consumer: Consumer) -> tuple[int, int]:
        async with self._db.transaction() as tx:
            return await BridgeStore(tx).last_sequences(consumer.pk)


def _nameable(name: str) -> bool:
    """Could a channel or consumer id be this (ids are at most 255 characters, no NUL)."""
    return len(name) <= MAX_FIELD_LENGTH and "\x00" not in name
