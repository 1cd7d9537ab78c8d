"""Push delivery use cases: claim due jobs of push consumers, record each outcome."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from app.domain.jobs import JobStatus, RetryPolicy
from app.domain.models import Consumer, ConsumerType, PulledJob, PushState
from app.store import attempts
from app.store.db import Database, Tx
from app.store.jobs import JobStore
from app.store.push_state import PushStateStore
from app.store.queue import Named, Queue
from app.store.stakeholders import ConsumerStore


class PushJob(NamedTuple):
    """A leased job with the consumer it must be POSTed to (a tuple: one is made per job)."""

    job: PulledJob
    consumer: Consumer


@dataclass(frozen=True, slots=True)
class PushTarget:
    """A push consumer as a dispatcher sees it at the start of a round."""

    consumer: Consumer
    state: PushState


async def push_targets(db: Database) -> list[PushTarget]:
    """Every push consumer with what the dispatchers learned of its endpoint (every process's
    metrics show them, whether or not it pushes)."""
    async with db.transaction() as tx:
        consumers = await ConsumerStore(tx).push_consumers()
        states = await PushStateStore(tx).of([c.pk for c in consumers])
    return [PushTarget(c, states.get(c.pk, PushState())) for c in consumers]


@dataclass(frozen=True, slots=True)
class BreakerSettings:
    failures: int
    cooldown_seconds: int


class PushService:
    def __init__(
        self,
        db: Database,
        queue: Queue,
        policy: RetryPolicy,
        lease_seconds: int,
        breaker: BreakerSettings | None = None,
    ) -> None:
        self._db = db
        self._queue = queue
        self._policy = policy
        self._lease = lease_seconds
        self._breaker = breaker or BreakerSettings(5, 30)

    async def targets(self) -> list[PushTarget]:
        return await push_targets(self._db)

    async def start_probe(self, consumer: Consumer) -> bool:
        """This dispatcher sends the one probe of an open breaker whose cool-down passed."""
        async with self._db.transaction() as tx:
            return await PushStateStore(tx).start_probe(consumer.pk, self._lease)

    async def claim(self, consumer: Consumer, limit: int) -> list[PushJob]:
        """Lease up to `limit` due jobs of one push consumer, highest priority first."""
        # The push form of the claim: the dispatcher's lease, no max-ack-pending cap (a pull
        # setting: the dispatcher's window limits a push consumer) and no pending count.
        claimed = await self._queue.claim(
            Named.push(consumer.pk), limit=limit, default_ack_wait=self._lease
        )
        return [PushJob(job, consumer) for job in claimed.jobs]

    async def next_due(self, consumers: Sequence[Consumer]) -> datetime | None:
        async with self._db.transaction() as tx:
            return await JobStore(tx).next_due([c.pk for c in consumers])

    async def delivered(
        self,
        jobs: Sequence[PushJob],
        resets: Collection[int],
        codes: Sequence[int] | None = None,
    ) -> list[int]:
        """Record 2xx answers, one fenced statement per consumer (each alone: no transaction
        round trips on the dispatcher's hottest path); a job whose lease was lost meanwhile
        (swept, now another delivery's) is left alone. The consumers in `resets` had failures
        counted: their count goes back to zero and their breaker closes. Returns those whose
        state this changed. `codes`: each job's HTTP status (200 when not given), for its
        attempt history: one statement per consumer and status, nearly always one a consumer."""
        # By primary key: hashing the consumer itself hashes every one of its fields, per job.
        targets: defaultdict[tuple[int, int], list[tuple[int, int | None]]] = defaultdict(list)
        for index, job in enumerate(jobs):
            code = codes[index] if codes is not None else 200
            targets[job.consumer.pk, code].append((job.job.id, job.job.attempt))
        for (consumer_pk, code), pairs in targets.items():
            await self._queue.ack(
                Named(consumer_pk, type=ConsumerType.PUSH), pairs, note=_delivered_note(code)
            )
        if not resets:
            return []
        async with self._db.transaction() as tx:
            return await PushStateStore(tx).succeeded(list(resets))

    async def failed(
        self, job: PushJob, error: str, code: int | None = None
    ) -> tuple[JobStatus | None, PushState]:
        """A failed attempt: requeued with backoff, or dead once retries are used up; one more
        failure towards the consumer's breaker (its state after it is returned)."""
        async with self._db.transaction() as tx:
            moved = await JobStore(tx).fail(
                job.consumer.pk,
                [(job.job.id, job.job.attempt)],
                self._policy,
                reason=f"delivery failed after the last retry: {error}",
                last_error=error,
                note=attempts.note("failed", code=code, error=error),
            )
            state = await PushStateStore(tx).failed(
                job.consumer.pk, self._breaker.failures, self._breaker.cooldown_seconds
            )
            if moved and moved[0].status is JobStatus.QUEUED:
                tx.announce([job.consumer.pk])
        return (moved[0].status if moved else None), state

    async def deferred(
        self, job: PushJob, seconds: float, note: str, code: int | None = None
    ) -> bool:
        """The receiver asked for time (429/503 Retry-After): back to QUEUED, due then, no
        retry counted."""
        async with self._db.transaction() as tx:
            return await self._hand_back(tx, job, note, seconds, code, "deferred")

    async def gone(self, job: PushJob, note: str) -> bool:
        """410 Gone: push off for the consumer (its jobs stay QUEUED), this job handed back
        uncounted. True when this answer disabled it."""
        async with self._db.transaction() as tx:
            await self._hand_back(tx, job, note, None, 410, "gone")
            disabled = await PushStateStore(tx).disable(job.consumer.pk, note)
            if disabled:
                # Other dispatchers stop claiming for it before their next claim.
                tx.announce_change([job.consumer.pk])
            return disabled

    async def _hand_back(
        self,
        tx: Tx,
        job: PushJob,
        note: str,
        delay: float | None,
        code: int | None = None,
        outcome: str = "handed back",
    ) -> bool:
        """INFLIGHT -> QUEUED, due after `delay` (or at once), its retries untouched."""
        moved = await JobStore(tx).fail(
            job.consumer.pk,
            [(job.job.id, job.job.attempt)],
            self._policy,
            delay=delay,
            reason=note,
            last_error=note,
            counted=False,
            note=attempts.note(outcome, code=code, error=note),
        )
        return bool(moved)


_DELIVERED = {200: attempts.note("delivered", code=200)}


def _delivered_note(code: int) -> str:
    found = _DELIVERED.get(code)
    if found is None:
        found = _DELIVERED[code] = attempts.note("delivered", code=code)
    return found
