"""The Go webhook-broker's pull API (its pull consumer spec): list queued jobs, move one job
through the states the spec allows, and the dead-letter queue."""

from __future__ import annotations

from datetime import UTC, datetime

from app.domain.errors import Conflict, InvalidInput, InvalidTransition, NotFound
from app.domain.jobs import JobStatus, check_seed_transition
from app.domain.models import ClaimedJob, Consumer, Cursor, Job, Page
from app.domain.pulls import ConsumerCredentials, parse_job_id
from app.services.acking import announce_capacity
from app.services.auth import pull_consumer
from app.services.reads import Reads
from app.store.db import Database, Tx
from app.store.jobs import JobStore
from app.store.queue import Named, Queue
from app.store.stakeholders import check_consumer_tokens


class SeedJobService:
    def __init__(
        self, db: Database, queue: Queue, default_ack_wait: int, reads: Reads | None = None
    ) -> None:
        self._db = db
        # The lists (queued jobs, the DLQ) may be read from the replica. A job read stays on
        # the primary: a worker reads the job it just moved, and must see its move.
        self._reads = reads or Reads.primary_only(db)
        self._queue = queue
        self._default_ack_wait = default_ack_wait

    async def _consumer(
        self, tx: Tx, creds: ConsumerCredentials, *, any_type: bool = False
    ) -> Consumer:
        # Job reads and the dead-letter queue serve push consumers too.
        return await pull_consumer(tx, creds, require_pull=not any_type)

    async def queued_jobs(
        self, creds: ConsumerCredentials, limit: int, cursor: Cursor
    ) -> Page[ClaimedJob]:
        async def read(tx: Tx) -> Page[ClaimedJob]:
            consumer = await self._consumer(tx, creds)
            if limit == 0:
                return Page([])
            return await JobStore(tx).queued(consumer.pk, cursor, limit)

        return await self._reads.read(read)

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
                await _check_claimable(store, consumer)
                moved = await store.start(
                    current.id,
                    consumer.pk,
                    current.status,
                    ack_wait=consumer.ack_wait(self._default_ack_wait),
                    # 0 is "none", as in Go (an unsigned zero value): keep the stored one.
                    incremental_timeout=incremental_timeout or None,
                )
                changed = moved is not None
            elif target is JobStatus.DELIVERED:
                changed = bool(await self._queue.ack(Named(consumer.pk), targets, tx))
            else:
                changed = bool(
                    await store.complete(
                        consumer.pk, targets, JobStatus.DEAD, "marked dead by the consumer"
                    )
                )
            if not changed:
                # The spec answers 400 to every move but the allowed ones; by the time this
                # one ran, the job was no longer {current.status}.
                raise InvalidTransition(
                    f"job {job_id} was moved by another worker: it is no longer "
                    f"{current.status}; read it and retry"
                )
            announce_capacity(tx, consumer)

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
        async def read(tx: Tx) -> Page[Job]:
            consumer = await self._consumer(tx, creds, any_type=True)
            return await JobStore(tx).dead(consumer.pk, cursor, limit)

        return await self._reads.read(read)

    async def requeue_all_dead(self, creds: ConsumerCredentials) -> int:
        async with self._db.transaction() as tx:
            consumer = await self._consumer(tx, creds, any_type=True)
            return await _requeue_dead(tx, consumer)

    async def requeue_all_dead_by_form(
        self, channel_id: str, consumer_id: str, requeue: str | None
    ) -> int:
        """The Go original's form: `requeue=<the consumer's token>`, no token headers."""
        async with self._db.transaction() as tx:
            found = await check_consumer_tokens(tx, channel_id, None, consumer_id, requeue)
            if found is None or found.consumer is None:
                raise NotFound(f"consumer {consumer_id!r} of channel {channel_id!r} not found")
            if not requeue or not found.consumer_token_ok:
                raise InvalidInput("`requeue` form param must match consumer token")
            return await _requeue_dead(tx, found.consumer)

    async def purge_dead(self, creds: ConsumerCredentials) -> int:
        async with self._db.transaction() as tx:
            consumer = await self._consumer(tx, creds, any_type=True)
            return await JobStore(tx).purge_dead(consumer.pk)

    async def delete_dead_job(self, creds: ConsumerCredentials, job_id: str) -> None:
        async with self._db.transaction() as tx:
            consumer = await self._consumer(tx, creds, any_type=True)
            store = JobStore(tx)
            jid = parse_job_id(job_id)
            if not await store.delete_dead(consumer.pk, jid):
                await _explain_not_dead(store, consumer, jid, "only DEAD jobs are deleted")


async def _check_claimable(store: JobStore, consumer: Consumer) -> None:
    """What a pull checks before it claims, for the Go API's INFLIGHT.

    A priority policy is refused, not served: which request takes a job is the policy's to say
    (the pinned client, the overflow threshold, the priority order), and a Go API request
    names no group, pin or priority, so it cannot be a member of the group; taking the job
    would break the pin. maxAckPending is counted under the consumer row's lock, as the pull
    counts it, so that concurrent claims cannot pass it together."""
    if consumer.paused_at(datetime.now(UTC)):
        raise Conflict(
            f"consumer {consumer.id!r} is paused: its jobs are not claimed until it resumes"
        )
    if consumer.priority.active:
        raise Conflict(
            f"consumer {consumer.id!r} has the {consumer.priority.policy} priority "
            f"policy (group {consumer.priority.group!r}): its jobs are claimed only by pulls "
            "of its group (POST .../pull), not by NextState INFLIGHT"
        )
    cap = consumer.max_ack_pending
    if cap is not None and await store.inflight_locked(consumer.pk) >= cap:
        raise Conflict(
            f"Exceeded MaxAckPending of {cap}: the consumer has {cap} jobs in flight; ack one "
            "and retry"
        )


async def _requeue_dead(tx: Tx, consumer: Consumer) -> int:
    requeued = await JobStore(tx).requeue_dead(consumer.pk)
    if requeued:
        tx.announce([consumer.pk])
    return len(requeued)


async def _explain_not_dead(store: JobStore, consumer: Consumer, job_id: int, rule: str) -> None:
    """Why a dead-letter operation changed nothing: no such job (404) or not DEAD (400)."""
    current = await store.get(job_id, consumer.pk)
    if current is None:
        raise NotFound(f"job {job_id} not found for this consumer")
    raise InvalidInput(f"job {job_id} is {current.status}; {rule}")
