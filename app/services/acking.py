"""Acks of pulled jobs: ack, nak, term and progress, one by one or in batches, for the HTTP pull
API and the NATS bridge alike."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from app.domain.errors import Conflict, InvalidInput, NotFound
from app.domain.jobs import AckType, JobStatus, RetryPolicy, nak_delay
from app.domain.models import Consumer, Job, Observe, ignore
from app.domain.pulls import AckItem, AckOutcome, AckResult, ConsumerCredentials, parse_job_id
from app.services.auth import pull_consumer
from app.store.db import Database, Tx
from app.store.jobs import JobStore
from app.store.queue import Named, Queue

DONE = AckResult.DONE


@dataclass(frozen=True, slots=True)
class AckBatch:
    outcomes: list[AckOutcome]
    dead: list[Job]  # jobs a NAK sent to the dead letters (retries used up)


def announce_capacity(tx: Tx, consumer: Consumer) -> None:
    """Only a consumer capped by max-ack-pending has pulls waiting for in-flight jobs to end."""
    if consumer.max_ack_pending is not None:
        tx.announce([consumer.pk])


class AckService:
    def __init__(
        self,
        db: Database,
        queue: Queue,
        policy: RetryPolicy,
        default_ack_wait: int,
        max_batch: int,
        observe: Observe = ignore,
    ) -> None:
        self._observe = observe
        self._db = db
        self._queue = queue
        self._policy = policy
        self._default_ack_wait = default_ack_wait
        self._max_batch = max_batch

    async def ack(self, creds: ConsumerCredentials, job_id: str, item: AckItem) -> AckOutcome:
        """One job's ack; an ack that changes nothing raises, saying why."""
        jid = parse_job_id(job_id)
        item = item._replace(id=jid)
        (outcome,) = await self.ack_many(creds, [item])
        if outcome.result is AckResult.UNKNOWN_JOB:
            raise NotFound(outcome.detail)
        if not outcome.result.applied:
            raise Conflict(outcome.detail)
        return outcome

    async def ack_many(
        self, creds: ConsumerCredentials, items: Sequence[AckItem]
    ) -> list[AckOutcome]:
        if len(items) > self._max_batch:
            raise InvalidInput(f"at most {self._max_batch} acks per request")
        if creds.complete and _plain(items):
            assert creds.channel_token is not None and creds.consumer_token is not None
            named = Named.by_credentials(
                creds.channel_id, creds.channel_token, creds.consumer_id, creds.consumer_token
            )
            acked = await self._queue.ack(named, _targets(items))
            if len(acked) == len(items):
                return [AckOutcome(item.id, DONE) for item in items]
            async with self._db.transaction() as tx:
                consumer = await self._consumer(tx, creds)
                return await _explained(JobStore(tx), consumer, items, acked)

        async def apply(tx: Tx) -> list[AckOutcome]:
            return await self._apply(tx, await self._consumer(tx, creds), items)

        # One statement per kind of ack, each locking its jobs: a concurrent batch naming some
        # of them may lock them in the other order, and PostgreSQL rolls one of the two back
        # (in_transaction runs it again).
        return await self._db.in_transaction(apply)

    async def ack_for(self, consumer: Consumer, items: Sequence[AckItem]) -> AckBatch:
        """Acks for a consumer already looked up (the NATS bridge); also reports which NAKs
        dead-lettered their job, for the MAX_DELIVERIES advisory."""
        if _plain(items):
            acked = await self._queue.ack(Named(consumer.pk), _targets(items))
            if len(acked) == len(items):
                return AckBatch([AckOutcome(item.id, DONE) for item in items], [])
            async with self._db.transaction() as tx:
                return AckBatch(await _explained(JobStore(tx), consumer, items, acked), [])

        async def apply(tx: Tx) -> AckBatch:
            outcomes = await self._apply(tx, consumer, items)
            naked = [
                o.id
                for o, item in zip(outcomes, items, strict=True)
                if o.result is DONE and item.type is AckType.NAK
            ]
            dead = [
                j
                for j in await JobStore(tx).many(naked, consumer.pk)
                if j.status is JobStatus.DEAD
            ] if naked else []  # fmt: skip
            return AckBatch(outcomes, dead)

        return await self._db.in_transaction(apply)

    async def _consumer(self, tx: Tx, creds: ConsumerCredentials) -> Consumer:
        return await pull_consumer(tx, creds)

    async def _apply(
        self, tx: Tx, consumer: Consumer, items: Sequence[AckItem]
    ) -> list[AckOutcome]:
        """Acks grouped by kind: one conditional UPDATE per (type, delay or reason)."""
        store = JobStore(tx)
        outcomes: dict[int, AckOutcome] = {}
        seen: set[int] = set()
        # (type, nak delay, term reason, nak counted)
        Kind = tuple[AckType, float | None, str | None, bool]
        groups: defaultdict[Kind, list[tuple[int, int | None]]] = defaultdict(list)
        repeated: list[int] = []
        for index, item in enumerate(items):
            if item.id in seen:
                repeated.append(index)
                continue
            seen.add(item.id)
            nak = item.type is AckType.NAK
            groups[
                (
                    item.type,
                    item.delay if nak else None,
                    item.reason or "terminated by the consumer"
                    if item.type is AckType.TERM
                    else None,
                    item.counted or not nak,
                )
            ].append((item.id, item.attempt))
        requeued = False
        for (kind, delay, reason, counted), targets in groups.items():
            if kind is AckType.ACK:
                for jid in await self._queue.ack(Named(consumer.pk), targets, tx):
                    outcomes[jid] = AckOutcome(jid, DONE)
                continue
            if kind is AckType.TERM:
                changed = await store.complete(consumer.pk, targets, JobStatus.DEAD, reason)
            elif kind is AckType.NAK:
                changed = await store.fail(
                    consumer.pk,
                    targets,
                    self._policy,
                    delay=nak_delay(delay),
                    reason="nak with no retries left",
                    counted=counted,
                )
                requeued = requeued or any(j.status is JobStatus.QUEUED for j in changed)
            else:
                ack_wait = consumer.ack_wait(self._default_ack_wait)
                changed = await store.extend(consumer.pk, targets, ack_wait)
            if changed:
                self._observe(kind.value, len(changed))
                if kind is AckType.NAK:
                    dead = sum(1 for j in changed if j.status is JobStatus.DEAD)
                    self._observe("dead_letter", dead)
            result = AckResult.EXTENDED if kind is AckType.PROGRESS else DONE
            for j in changed:
                outcomes[j.id] = AckOutcome(j.id, result, "", j.lease_expires_at)
        skipped = set(repeated)
        unique = [item for index, item in enumerate(items) if index not in skipped]
        for outcome in await _explained(store, consumer, unique, set(outcomes)):
            outcomes.setdefault(outcome.id, outcome)
        if requeued:
            tx.announce([consumer.pk])
        else:
            announce_capacity(tx, consumer)
        results = [outcomes[item.id] for item in items]
        for index in repeated:
            results[index] = AckOutcome(
                items[index].id, AckResult.REPEATED, "job named twice in one request"
            )
        return results


def _plain(items: Sequence[AckItem]) -> bool:
    """Acks that one statement settles: all of type ack, each job named once."""
    return (
        bool(items)
        and all(item.type is AckType.ACK for item in items)
        and len({item.id for item in items}) == len(items)
    )


def _targets(items: Sequence[AckItem]) -> list[tuple[int, int | None]]:
    return [(item.id, item.attempt) for item in items]


async def _explained(
    store: JobStore, consumer: Consumer, items: Sequence[AckItem], done: set[int]
) -> list[AckOutcome]:
    """The outcome of each item, those not in `done` explained by reading their jobs (a
    read-only query: the write that changed nothing is never run again)."""
    missing = [item.id for item in items if item.id not in done]
    current = {j.id: j for j in await store.many(missing, consumer.pk)} if missing else {}
    outcomes = []
    for item in items:
        jid = item.id
        found = current.get(jid)
        if jid in done:
            outcomes.append(AckOutcome(jid, DONE))
        elif found is None:
            outcomes.append(
                AckOutcome(jid, AckResult.UNKNOWN_JOB, f"job {jid} not found for this consumer")
            )
        elif found.status is not JobStatus.INFLIGHT:
            outcomes.append(
                AckOutcome(
                    jid, AckResult.NOT_INFLIGHT, f"job {jid} is {found.status}, not INFLIGHT"
                )
            )
        elif item.attempt is None or item.attempt == found.attempt:
            # In flight again, as this attempt or any: it was claimed anew between the ack and
            # this read.
            outcomes.append(
                AckOutcome(
                    jid,
                    AckResult.STALE_ATTEMPT,
                    f"job {jid} changed state concurrently; it is on attempt {found.attempt}",
                )
            )
        else:
            outcomes.append(
                AckOutcome(
                    jid,
                    AckResult.STALE_ATTEMPT,
                    f"attempt {item.attempt} is stale; the job is on attempt {found.attempt}",
                )
            )
    return outcomes
