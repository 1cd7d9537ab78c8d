"""Pulls over HTTP: a pull that finds work is one claim statement; one that waits joins the
shared pull scheduler (app/services/scheduler.py) beside the bridge's JetStream requests."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from dataclasses import dataclass

from app.domain.errors import Conflict, InvalidInput, PinLost, TooManyWaiting
from app.domain.models import Consumer, PulledJob
from app.domain.priority import PLAIN, PullPriority, check_pull
from app.domain.pulls import (
    MESSAGE_SIZE_EXCEEDS_MAX_BYTES,
    MIN_HEARTBEAT_SECONDS,
    ConsumerCredentials,
    Delivery,
    PullEnd,
    PullLimits,
    PullRequest,
    PullResult,
    exceeds_max_bytes,
)
from app.services.auth import pull_consumer
from app.services.claiming import ClaimSource
from app.services.consumer_state import ConsumerSnapshot, snapshot
from app.services.scheduler import PullScheduler, PullSink, Waiter
from app.services.streaming import PullStream, StreamSink
from app.store.db import Database
from app.store.queue import Named, Queue

# What a pull that names a pin it does not hold is told (nats-server's status texts).
PIN_LOST = {
    PullEnd.PIN_MISMATCH: "Nats-Pin-Id mismatch: another client holds the pin",
    PullEnd.WRONG_PIN: "Nats-Wrong-Pin-Id: the pin is no longer held; pull without an id",
}


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    snapshot: ConsumerSnapshot
    waiting: int  # pull requests waiting in this process


class Collected:
    """The scheduler's sink for an in-process caller: the jobs, once the request ends."""

    numbered = False
    claims_ahead = False
    outlet: Hashable = None

    def __init__(self) -> None:
        self.jobs: list[PulledJob] = []
        self.pending = 0
        self.pin: str | None = None
        self.outcome: PullEnd | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def alive(self) -> bool:
        return not self.done.done()

    def ready(self) -> bool:
        return True

    def offer(self, consumer: Consumer, delivery: Delivery, bytes_left: int | None) -> int | None:
        # The claim statement keeps a byte budget but always takes its first job.
        if exceeds_max_bytes(len(delivery.job.payload), bytes_left):
            return None
        self.jobs.append(delivery.job)
        self.pending = delivery.pending
        self.pin = delivery.pin
        return len(delivery.job.payload)

    def end(self, outcome: PullEnd, waiter: Waiter, pending: int) -> None:
        self.outcome = outcome
        if not self.jobs:
            self.pending = pending
        if not self.done.done():
            self.done.set_result(None)

    def heartbeat(self, last_seq: int, last_stream_seq: int) -> None:
        pass

    async def flush(self) -> None:
        pass


class PullService:
    def __init__(
        self,
        db: Database,
        queue: Queue,
        claims: ClaimSource,
        scheduler: PullScheduler,
        limits: PullLimits,
    ) -> None:
        self._db = db
        self._queue = queue
        self._claims = claims
        self._scheduler = scheduler
        self._limits = limits

    def drain(self) -> None:
        """Shutting down: waiting pulls return at once with whatever they have."""
        self._scheduler.drain()

    def validate(self, request: PullRequest) -> None:
        limits = self._limits
        max_batch = limits.max_stream_batch if request.stream else limits.max_batch
        if not 1 <= request.batch <= max_batch:
            kind = "a streaming pull's batch" if request.stream else "batch"
            raise InvalidInput(f"{kind} must be between 1 and {max_batch}")
        if not 0 <= request.expires <= limits.max_expires_seconds:
            raise InvalidInput(
                f"expires must be between 0 and {limits.max_expires_seconds} seconds"
            )
        heartbeat = request.idle_heartbeat
        if heartbeat is not None and not (
            MIN_HEARTBEAT_SECONDS <= heartbeat <= request.expires / 2
        ):
            # As JetStream: a heartbeat must come at least twice before the request expires.
            raise InvalidInput(
                f"idle_heartbeat must be between {MIN_HEARTBEAT_SECONDS} seconds and half of"
                " expires"
            )
        if request.max_bytes is not None and request.max_bytes < 1:
            raise InvalidInput("max_bytes must be positive")
        if request.incremental_timeout < 0:
            raise InvalidInput("incremental_timeout must not be negative")

    async def authenticate(self, creds: ConsumerCredentials) -> Consumer:
        async with self._db.transaction() as tx:
            return await pull_consumer(tx, creds)

    async def stream(self, creds: ConsumerCredentials, request: PullRequest) -> PullStream:
        """A streaming pull, waiting in the scheduler until batch, max_bytes or expires is
        reached; the caller reads its events and closes it."""
        self.validate(request)
        consumer = await self.authenticate(creds)
        terms = check_pull(consumer.priority, request.terms)
        waits = not request.no_wait and request.expires > 0 and not self._scheduler.draining
        sink = StreamSink(
            lambda: self._scheduler.wake(consumer.pk), self._limits.max_stream_buffer_bytes
        )
        waiter = self._join(consumer, request, terms, sink, waits=waits, ends_on_delivery=False)
        return PullStream(self._scheduler, self._claims, consumer, waiter)

    async def info(self, creds: ConsumerCredentials) -> ConsumerInfo:
        consumer = await self.authenticate(creds)
        return ConsumerInfo(
            await snapshot(self._db, consumer), self._scheduler.waiting(consumer.pk)
        )

    async def pull(self, creds: ConsumerCredentials, request: PullRequest) -> PullResult:
        """A pull that finds work is one statement; the credentials are checked inside it."""
        self.validate(request)
        waits = not request.no_wait and request.expires > 0 and not self._scheduler.draining
        # Priority terms are checked against the consumer first: such a request never claims
        # before it is read (nor does any request of a consumer with a priority policy).
        fast = creds.complete and request.terms == PLAIN
        if fast:
            assert creds.channel_token is not None and creds.consumer_token is not None
            named = Named.by_credentials(
                creds.channel_id, creds.channel_token, creds.consumer_id, creds.consumer_token
            )
            claimed = await self._queue.claim(
                named,
                limit=request.batch,
                default_ack_wait=self._claims.default_ack_wait,
                incremental_timeout=request.incremental_timeout,
                max_bytes=request.max_bytes,
            )
            if claimed.jobs:
                await self._refuse_oversized(creds, None, claimed.jobs, request.max_bytes)
                return PullResult(claimed.jobs, claimed.pending)
        # Nothing claimed: bad credentials (raised here), a capped consumer (its claim needs
        # a lock), or nothing due, when only a pull that waits goes on.
        consumer = await self.authenticate(creds)
        terms = check_pull(consumer.priority, request.terms)
        if consumer.priority.active:
            # Which request takes a job is the policy's to say: even a pull that does not
            # wait is served by the scheduler, beside the requests that do.
            return await self.wait(consumer, request, terms, waits=waits)
        capped = consumer.max_ack_pending is not None
        if not waits:
            if not capped and fast:  # the claim above found nothing
                return PullResult([], 0)
            batch = await self._claims.claim(
                consumer,
                request.batch,
                numbered=False,
                max_bytes=request.max_bytes,
                incremental_timeout=request.incremental_timeout,
            )
            jobs = [d.job for d in batch.deliveries]
            await self._refuse_oversized(creds, consumer, jobs, request.max_bytes)
            return PullResult(jobs, batch.due)
        return await self.wait(consumer, request, terms)

    async def _refuse_oversized(
        self,
        creds: ConsumerCredentials,
        consumer: Consumer | None,
        jobs: list[PulledJob],
        max_bytes: int | None,
    ) -> None:
        """The streaming pull's and JetStream's rule (exceeds_max_bytes) for a pull answered
        at once: the claim statement always takes its first job, so a first job larger than
        max_bytes is given back (its attempt too) and the pull answers 409."""
        if not jobs or not exceeds_max_bytes(len(jobs[0].payload), max_bytes):
            return
        if consumer is None:
            consumer = await self.authenticate(creds)
        await self._claims.release(consumer.pk, [(j.id, j.attempt) for j in jobs])
        raise Conflict(
            f"{MESSAGE_SIZE_EXCEEDS_MAX_BYTES}: the next job is {len(jobs[0].payload)} bytes, "
            f"max_bytes is {max_bytes}"
        )

    def _join(
        self,
        consumer: Consumer,
        request: PullRequest,
        terms: PullPriority,
        sink: PullSink,
        *,
        waits: bool,
        ends_on_delivery: bool,
    ) -> Waiter:
        """The request, waiting in the scheduler (unless as many wait on the consumer as may)."""
        full = self._scheduler.full_reason(consumer)
        if full is not None:
            raise TooManyWaiting(full)
        loop = asyncio.get_running_loop()
        waiter = Waiter(
            sink,
            batch_left=request.batch,
            bytes_left=request.max_bytes,
            no_wait=not waits,
            expires_given=False,
            expires_at=loop.time() + request.expires if waits else None,
            heartbeat=request.idle_heartbeat,
            incremental_timeout=request.incremental_timeout,
            ends_on_delivery=ends_on_delivery,
            terms=terms,
        )
        self._scheduler.submit(consumer, waiter)
        return waiter

    async def wait(
        self,
        consumer: Consumer,
        request: PullRequest,
        terms: PullPriority = PLAIN,
        *,
        waits: bool = True,
    ) -> PullResult:
        """Join the scheduler: up to `batch` jobs, ending with the first hand-out or after
        `expires` seconds (or, for a pull that does not wait, when nothing is there for it)."""
        sink = Collected()
        waiter = self._join(consumer, request, terms, sink, waits=waits, ends_on_delivery=True)
        try:
            await asyncio.shield(sink.done)
        finally:
            if not sink.done.done():  # the caller went away: so does its request
                self._scheduler.drop(lambda w: w is waiter)
        if sink.outcome in PIN_LOST:
            raise PinLost(PIN_LOST[sink.outcome])
        if sink.outcome is PullEnd.TOO_LARGE and not sink.jobs:
            raise Conflict(
                f"{MESSAGE_SIZE_EXCEEDS_MAX_BYTES}: the next job is larger than max_bytes "
                f"({request.max_bytes})"
            )
        return PullResult(sink.jobs, sink.pending, sink.pin)
