"""Pulls: batch claims with long polling, for the HTTP pull API (the NATS bridge claims
through BridgeService, on the same Queue statement)."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime

from app.domain.errors import InvalidInput, TooManyWaiting
from app.domain.models import Consumer, ConsumerType
from app.domain.pulls import ConsumerCredentials, PullLimits, PullRequest, PullResult
from app.services.auth import pull_consumer
from app.services.signals import Signals
from app.store.db import Database
from app.store.jobs import JobStore
from app.store.queue import Claimed, Named, Queue
from app.store.stakeholders import ConsumerStore

# A waiter whose next job falls due later re-checks no sooner than this, so clock skew between
# the database and this process can never turn waiting into a busy loop.
MIN_RECHECK_SECONDS = 0.05


class PullService:
    def __init__(
        self,
        db: Database,
        queue: Queue,
        signals: Signals,
        default_ack_wait: int,
        limits: PullLimits,
    ) -> None:
        self._db = db
        self._queue = queue
        self._signals = signals
        self._default_ack_wait = default_ack_wait
        self._limits = limits
        self._draining = False

    def drain(self) -> None:
        """Shutting down: waiting pulls return at once with whatever they have."""
        self._draining = True
        self._signals.wake_all()

    def ack_wait(self, consumer: Consumer) -> int:
        return consumer.ack_wait_seconds or self._default_ack_wait

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
            return await pull_consumer(
                tx, creds.channel_id, creds.channel_token, creds.consumer_id, creds.consumer_token
            )

    async def pull(self, creds: ConsumerCredentials, request: PullRequest) -> PullResult:
        """A pull that finds work is one statement; the credentials are checked inside it."""
        self.validate(request)
        if creds.complete:
            assert creds.channel_token is not None and creds.consumer_token is not None
            named = Named.by_credentials(
                creds.channel_id, creds.channel_token, creds.consumer_id, creds.consumer_token
            )
            claimed = await self._claim(named, request, None)
            if claimed.jobs:
                return PullResult(claimed.jobs, claimed.pending)
        # Nothing claimed: bad credentials (raised here), a capped consumer (its claim needs
        # a lock), or nothing due, when only a pull that waits goes on.
        consumer = await self.authenticate(creds)
        uncapped = consumer.max_ack_pending is None
        if uncapped and creds.complete and (request.no_wait or request.expires <= 0):
            return PullResult([], 0)
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
            while True:
                woken.clear()
                claimed = await self._claim(
                    Named(consumer.pk), request, consumer.max_ack_pending
                )
                if claimed.jobs:
                    return PullResult(claimed.jobs, claimed.pending)
                # Nothing: re-read the consumer, which a PUT may have changed (and woken us)
                # or deleted, and when nothing is due, when the next job falls due.
                async with self._db.transaction() as tx:
                    fresh = await ConsumerStore(tx).get_by_pk(consumer.pk)
                    next_due = (
                        await JobStore(tx).next_due([consumer.pk])
                        if claimed.pending == 0
                        else None
                    )
                if fresh is None or fresh.type is not ConsumerType.PULL:
                    return PullResult([], 0)
                remaining = deadline - loop.time()
                if not waits or remaining <= 0 or self._draining:
                    return PullResult([], claimed.pending)
                if _claims_differently(fresh, consumer):
                    consumer = fresh
                    continue
                timeout = remaining
                if next_due is not None:
                    until_due = (next_due - datetime.now(UTC)).total_seconds()
                    timeout = min(timeout, max(until_due, MIN_RECHECK_SECONDS))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), timeout=timeout)

    async def _claim(
        self, named: Named, request: PullRequest, max_ack_pending: int | None
    ) -> Claimed:
        return await self._queue.claim(
            named,
            limit=request.batch,
            default_ack_wait=self._default_ack_wait,
            incremental_timeout=request.incremental_timeout,
            max_bytes=request.max_bytes,
            max_ack_pending=max_ack_pending,
        )


def _claims_differently(fresh: Consumer, used: Consumer) -> bool:
    return (fresh.max_ack_pending, fresh.ack_wait_seconds) != (
        used.max_ack_pending,
        used.ack_wait_seconds,
    )
