"""Pull delivery: the seed spec's job API, batch claims with long polling, and acks.

The NATS bridge and the HTTP API both call these use cases; each opens its own transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple, overload

from app.domain.errors import Conflict, InvalidInput, NotFound, TooManyWaiting
from app.domain.jobs import AckType, JobStatus, RetryPolicy, check_seed_transition
from app.domain.models import ClaimedJob, Consumer, ConsumerType, Cursor, Job, Page, PulledJob
from app.services.auth import pull_consumer
from app.store import hotpath
from app.store.db import Database, Tx
from app.store.jobs import JobStore
from app.store.signals import Signals
from app.store.stakeholders import ConsumerStore

# A waiter whose next job falls due later re-checks no sooner than this, so clock skew between
# the database and this process can never turn waiting into a busy loop.
MIN_RECHECK_SECONDS = 0.05
# Job ids are BIGINT: anything larger names no job.
MAX_JOB_ID = 2**63 - 1


@dataclass(frozen=True, slots=True)
class ConsumerCredentials:
    channel_id: str
    channel_token: str | None
    consumer_id: str
    consumer_token: str | None


@dataclass(frozen=True, slots=True)
class PullLimits:
    max_batch: int
    max_expires_seconds: int
    max_waiting: int


@dataclass(frozen=True, slots=True)
class PullRequest:
    batch: int = 1
    max_bytes: int | None = None
    expires: float = 30.0
    no_wait: bool = False
    incremental_timeout: int = 0


@dataclass(frozen=True, slots=True)
class PullResult:
    jobs: list[PulledJob]
    pending: int

    @classmethod
    def of(cls, claimed: list[ClaimedJob], pending: int) -> PullResult:
        return cls([PulledJob.of(c) for c in claimed], pending)


class AckItem(NamedTuple):
    id: int
    type: AckType
    attempt: int | None = None
    delay: float | None = None
    reason: str | None = None


class AckOutcome(NamedTuple):
    id: int
    status: int  # 202 accepted, 200 progress, 404 unknown job, 409 not in flight / stale attempt
    detail: str = ""
    lease_expires_at: datetime | None = None


def parse_job_id(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise NotFound(f"job {raw!r} not found") from None
    if not 1 <= value <= MAX_JOB_ID:
        raise NotFound(f"job {raw!r} not found")
    return value


class DeliveryService:
    def __init__(
        self,
        db: Database,
        signals: Signals,
        policy: RetryPolicy,
        default_ack_wait: int,
        limits: PullLimits,
    ) -> None:
        self._db = db
        self._signals = signals
        self._policy = policy
        self._default_ack_wait = default_ack_wait
        self._limits = limits
        self._draining = False

    def drain(self) -> None:
        """Shutting down: waiting pulls return at once with whatever they have."""
        self._draining = True
        self._signals.wake_all()

    def ack_wait(self, consumer: Consumer) -> int:
        return consumer.ack_wait_seconds or self._default_ack_wait

    async def _consumer(
        self, tx: Tx, creds: ConsumerCredentials, *, any_type: bool = False
    ) -> Consumer:
        return await pull_consumer(
            tx,
            creds.channel_id,
            creds.channel_token,
            creds.consumer_id,
            creds.consumer_token,
            require_pull=not any_type,
        )

    # -- the seed spec -------------------------------------------------------------------------

    async def queued_jobs(
        self, creds: ConsumerCredentials, limit: int, cursor: Cursor
    ) -> Page[ClaimedJob]:
        async with self._db.transaction() as tx:
            consumer = await self._consumer(tx, creds)
            if limit == 0:
                return Page([])
            return await JobStore(tx).queued(consumer.pk, cursor, limit)

    async def set_state(
        self,
        creds: ConsumerCredentials,
        job_id: str,
        target: JobStatus,
        incremental_timeout: int | None,
    ) -> None:
        """Move a job as the seed spec allows; already in `target` changes nothing."""
        async with self._db.transaction() as tx:
            consumer = await self._consumer(tx, creds)
            store = JobStore(tx)
            current = await store.get(parse_job_id(job_id), consumer.pk)
            if current is None:
                raise NotFound(f"job {job_id!r} not found for this consumer")
            if not check_seed_transition(current.status, target, incremental_timeout):
                return
            targets = [(current.id, current.attempt)]
            if target is JobStatus.INFLIGHT:
                moved = await store.start(
                    current.id,
                    consumer.pk,
                    current.status,
                    ack_wait=self.ack_wait(consumer),
                    incremental_timeout=incremental_timeout or 0,
                )
                changed = [moved] if moved else []
            elif target is JobStatus.DELIVERED:
                changed = await store.complete(consumer.pk, targets, JobStatus.DELIVERED)
            else:
                changed = await store.complete(
                    consumer.pk, targets, JobStatus.DEAD, "marked dead by the consumer"
                )
            if not changed:
                raise Conflict(f"job {job_id} changed state concurrently; read it and retry")
            self._announce_capacity(tx, consumer)

    async def get_job(self, creds: ConsumerCredentials, job_id: str) -> ClaimedJob:
        async with self._db.transaction() as tx:
            consumer = await self._consumer(tx, creds, any_type=True)
            found = await JobStore(tx).get_with_message(parse_job_id(job_id), consumer.pk)
        if found is None:
            raise NotFound(f"job {job_id!r} not found for this consumer")
        return found

    async def requeue_dead_job(self, creds: ConsumerCredentials, job_id: str) -> None:
        async with self._db.transaction() as tx:
            consumer = await self._consumer(tx, creds, any_type=True)
            store = JobStore(tx)
            jid = parse_job_id(job_id)
            if not await store.requeue_dead(consumer.pk, jid):
                await _explain_not_dead(store, consumer, jid, "only DEAD jobs are requeued")
            tx.announce([consumer.pk])

    async def dead_jobs(self, creds: ConsumerCredentials, cursor: Cursor, limit: int) -> Page[Job]:
        async with self._db.transaction() as tx:
            consumer = await self._consumer(tx, creds, any_type=True)
            return await JobStore(tx).dead(consumer.pk, cursor, limit)

    async def requeue_all_dead(self, creds: ConsumerCredentials) -> int:
        async with self._db.transaction() as tx:
            consumer = await self._consumer(tx, creds, any_type=True)
            requeued = await JobStore(tx).requeue_dead(consumer.pk)
            if requeued:
                tx.announce([consumer.pk])
            return len(requeued)

    async def delete_dead_job(self, creds: ConsumerCredentials, job_id: str) -> None:
        async with self._db.transaction() as tx:
            consumer = await self._consumer(tx, creds, any_type=True)
            store = JobStore(tx)
            jid = parse_job_id(job_id)
            if not await store.delete_dead(consumer.pk, jid):
                await _explain_not_dead(store, consumer, jid, "only DEAD jobs are deleted")

    # -- batch claims with long polling --------------------------------------------------------

    def validate(self, request: PullRequest) -> None:
        limits = self._limits
        if not 1 <= request.batch <= limits.max_batch:
            raise InvalidInput(f"batch must be between 1 and {limits.max_batch}")
        if not 0 <= request.expires <= limits.max_expires_seconds:
            raise InvalidInput(
                f"expires must be between 0 and {limits.max_expires_seconds} seconds"
            )
        if request.max_bytes is not None and request.max_bytes < 1:
            raise InvalidInput("max_bytes must be positive")
        if request.incremental_timeout < 0:
            raise InvalidInput("incremental_timeout must not be negative")

    async def authenticate(self, creds: ConsumerCredentials) -> Consumer:
        async with self._db.transaction() as tx:
            return await self._consumer(tx, creds)

    async def pull(self, creds: ConsumerCredentials, request: PullRequest) -> PullResult:
        self.validate(request)
        quick = await self._quick_claim(request, creds=creds)
        if quick is not None:
            return quick
        # The first claim authenticates in its own transaction: a pull that finds work costs
        # one transaction, and only a pull that has to wait goes on to subscribe.
        consumer, claimed, pending, _ = await self._claim_once(None, request, creds=creds)
        if claimed or request.no_wait or request.expires <= 0:
            return PullResult.of(claimed, pending)
        return await self.pull_for(consumer, request)

    async def pull_for(self, consumer: Consumer, request: PullRequest) -> PullResult:
        """Claim up to `batch` jobs, waiting up to `expires` seconds for the first one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request.expires
        waits = not request.no_wait and request.expires > 0
        if waits and self._signals.waiting(consumer.pk) >= self._limits.max_waiting:
            raise TooManyWaiting(
                f"{self._limits.max_waiting} pull requests are already waiting on this consumer"
            )
        # Subscribe before the first claim so a publish between claim and wait is not missed.
        with self._signals.subscribe(consumer.pk) as woken:
            refresh = False
            while True:
                woken.clear()
                if consumer.max_ack_pending is None:
                    quick = await self._quick_claim(request, consumer_pk=consumer.pk)
                    if quick is not None:
                        return quick
                # Re-checks re-read the consumer: a PUT may have changed maxAckPending or
                # ackWait (and wakes us), or deleted the consumer, while we waited.
                current = await self._claim_once(consumer, request, refresh=refresh)
                if current is None:
                    return PullResult([], 0)
                consumer, claimed, pending, next_due = current
                refresh = True
                remaining = deadline - loop.time()
                if claimed or not waits or remaining <= 0 or self._draining:
                    return PullResult.of(claimed, pending)
                timeout = remaining
                if next_due is not None and pending == 0:
                    until_due = (next_due - datetime.now(UTC)).total_seconds()
                    timeout = min(timeout, max(until_due, MIN_RECHECK_SECONDS))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), timeout=timeout)

    async def _quick_claim(
        self,
        request: PullRequest,
        *,
        creds: ConsumerCredentials | None = None,
        consumer_pk: int | None = None,
    ) -> PullResult | None:
        """PostgreSQL, no byte budget: the claim as one statement. None when it claimed
        nothing (or does not apply): the full transaction then says why, or waits."""
        if self._db.dialect != "postgresql" or request.max_bytes is not None:
            return None
        if creds is not None and (creds.channel_token is None or creds.consumer_token is None):
            return None
        if creds is not None:
            assert creds.channel_token is not None and creds.consumer_token is not None
            named = hotpath.Named.by_credentials(
                creds.channel_id, creds.channel_token, creds.consumer_id, creds.consumer_token
            )
        else:
            named = hotpath.Named(consumer_pk)
        claimed = await hotpath.claim(
            self._db,
            named,
            limit=request.batch,
            default_ack_wait=self._default_ack_wait,
            incremental_timeout=request.incremental_timeout,
        )
        return PullResult(claimed.jobs, claimed.pending) if claimed.jobs else None

    @overload
    async def _claim_once(
        self, consumer: None, request: PullRequest, *, creds: ConsumerCredentials
    ) -> tuple[Consumer, list[ClaimedJob], int, datetime | None]: ...

    @overload
    async def _claim_once(
        self, consumer: Consumer, request: PullRequest, *, refresh: bool = False
    ) -> tuple[Consumer, list[ClaimedJob], int, datetime | None] | None: ...

    async def _claim_once(
        self,
        consumer: Consumer | None,
        request: PullRequest,
        *,
        refresh: bool = False,
        creds: ConsumerCredentials | None = None,
    ) -> tuple[Consumer, list[ClaimedJob], int, datetime | None] | None:
        """One claim: the consumer as used, the jobs, due jobs left, and when the next is due.

        With `creds` it authenticates first, in the same transaction. None when `refresh`
        finds the consumer deleted or no longer a pull consumer.
        """
        async with self._db.transaction() as tx:
            if creds is not None:
                consumer = await self._consumer(tx, creds)
            assert consumer is not None
            if refresh:
                fresh = await ConsumerStore(tx).get_by_pk(consumer.pk)
                if fresh is None or fresh.type is not ConsumerType.PULL:
                    return None
                consumer = fresh
            store = JobStore(tx)
            claimed = await store.claim(
                consumer.pk,
                limit=request.batch,
                ack_wait=self.ack_wait(consumer),
                incremental_timeout=request.incremental_timeout,
                max_bytes=request.max_bytes,
                max_ack_pending=consumer.max_ack_pending,
            )
            pending, next_due = await store.left_after_claim(
                consumer.pk,
                claimed=len(claimed),
                limit=request.batch,
                max_bytes=request.max_bytes,
                max_ack_pending=consumer.max_ack_pending,
            )
        return consumer, claimed, pending, next_due

    # -- acks ----------------------------------------------------------------------------------

    async def ack(self, creds: ConsumerCredentials, job_id: str, item: AckItem) -> AckOutcome:
        jid = parse_job_id(job_id)
        outcome = (
            await self.ack_many(
                creds, [AckItem(jid, item.type, item.attempt, item.delay, item.reason)]
            )
        )[0]
        if outcome.status == 404:
            raise NotFound(outcome.detail)
        if outcome.status == 409:
            raise Conflict(outcome.detail)
        return outcome

    async def ack_many(
        self, creds: ConsumerCredentials, items: Sequence[AckItem]
    ) -> list[AckOutcome]:
        if len(items) > self._limits.max_batch:
            raise InvalidInput(f"at most {self._limits.max_batch} acks per request")
        acked = await self._quick_acks(creds, items)
        if len(acked) == len(items):
            return [AckOutcome(item.id, 202) for item in items]
        rest = [item for item in items if item.id not in acked]
        async with self._db.transaction() as tx:
            consumer = await self._consumer(tx, creds)
            explained = iter(await self.apply_acks(tx, consumer, rest))
        return [AckOutcome(item.id, 202) if item.id in acked else next(explained) for item in items]

    async def _quick_acks(self, creds: ConsumerCredentials, items: Sequence[AckItem]) -> set[int]:
        if creds.channel_token is None or creds.consumer_token is None:
            return set()
        named = hotpath.Named.by_credentials(
            creds.channel_id, creds.channel_token, creds.consumer_id, creds.consumer_token
        )
        return await self.plain_acks(named, items)

    async def plain_acks(self, named: hotpath.Named, items: Sequence[AckItem]) -> set[int]:
        """Plain acks on PostgreSQL: the consumer check and the update in one statement. The
        ids acked; whatever is left (or went wrong) takes the full transaction, which explains
        it."""
        if (
            self._db.dialect != "postgresql"
            or not items
            or any(item.type is not AckType.ACK for item in items)
            or len({item.id for item in items}) != len(items)
        ):
            return set()
        return await hotpath.ack(self._db, named, [(item.id, item.attempt) for item in items])

    async def apply_acks(
        self, tx: Tx, consumer: Consumer, items: Sequence[AckItem]
    ) -> list[AckOutcome]:
        """Apply acks grouped by kind: one conditional UPDATE per (type, delay or reason)."""
        store = JobStore(tx)
        outcomes: dict[int, AckOutcome] = {}
        seen: set[int] = set()
        groups: defaultdict[tuple[AckType, float | str | None], list[tuple[int, int | None]]] = (
            defaultdict(list)
        )
        duplicates: list[int] = []
        for index, item in enumerate(items):
            if item.id in seen:
                duplicates.append(index)
                continue
            seen.add(item.id)
            key: float | str | None = item.delay if item.type is AckType.NAK else None
            if item.type is AckType.TERM:
                key = item.reason or "terminated by the consumer"
            groups[(item.type, key)].append((item.id, item.attempt))
        requeued = False
        for (kind, key), targets in groups.items():
            if kind is AckType.ACK:
                changed = await store.complete(consumer.pk, targets, JobStatus.DELIVERED)
            elif kind is AckType.TERM:
                changed = await store.complete(consumer.pk, targets, JobStatus.DEAD, str(key))
            elif kind is AckType.NAK:
                delay = float(key) if isinstance(key, int | float) else None
                changed = await store.fail(
                    consumer.pk,
                    targets,
                    self._policy,
                    delay=delay,
                    reason="nak with no retries left",
                )
                requeued = requeued or any(j.status is JobStatus.QUEUED for j in changed)
            else:
                changed = await store.extend(consumer.pk, targets, self.ack_wait(consumer))
            for j in changed:
                status = 200 if kind is AckType.PROGRESS else 202
                outcomes[j.id] = AckOutcome(j.id, status, "", j.lease_expires_at)
        missing = [item.id for item in items if item.id not in outcomes]
        if missing:
            await self._explain(store, consumer, items, missing, outcomes)
        if requeued:
            tx.announce([consumer.pk])
        else:
            self._announce_capacity(tx, consumer)
        results = [outcomes[item.id] for item in items]
        for index in duplicates:
            results[index] = AckOutcome(items[index].id, 409, "job named twice in one request")
        return results

    async def _explain(
        self,
        store: JobStore,
        consumer: Consumer,
        items: Sequence[AckItem],
        missing: list[int],
        outcomes: dict[int, AckOutcome],
    ) -> None:
        current = {j.id: j for j in await store.many(missing, consumer.pk)}
        wanted = {item.id: item for item in items}
        for jid in missing:
            found = current.get(jid)
            if found is None:
                outcomes[jid] = AckOutcome(jid, 404, f"job {jid} not found for this consumer")
            elif found.status is not JobStatus.INFLIGHT:
                outcomes[jid] = AckOutcome(jid, 409, f"job {jid} is {found.status}, not INFLIGHT")
            else:
                outcomes[jid] = AckOutcome(
                    jid,
                    409,
                    f"attempt {wanted[jid].attempt} is stale; "
                    f"the job is on attempt {found.attempt}",
                )

    def _announce_capacity(self, tx: Tx, consumer: Consumer) -> None:
        # Only a consumer capped by max-ack-pending has pulls waiting for in-flight jobs to end.
        if consumer.max_ack_pending is not None:
            tx.announce([consumer.pk])


async def _explain_not_dead(store: JobStore, consumer: Consumer, job_id: int, rule: str) -> None:
    """Why a dead-letter operation changed nothing: no such job (404) or not DEAD (400)."""
    current = await store.get(job_id, consumer.pk)
    if current is None:
        raise NotFound(f"job {job_id} not found for this consumer")
    raise InvalidInput(f"job {job_id} is {current.status}; {rule}")
