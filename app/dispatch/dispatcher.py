"""The push dispatcher: claims due jobs of push consumers and POSTs them to callback URLs.

Nothing lives only in memory: a job is leased in the database before it is sent, and its
outcome is recorded with one fenced, conditional update. A crash mid-delivery leaves the job
INFLIGHT until its lease expires; then the sweeper requeues it and it is delivered again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import time
import uuid
from datetime import UTC, datetime

import httpx

from app.services.push import PushJob, PushService
from app.services.signals import ANY_CONSUMER, Signals

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Broker-Signature"
CLAIM_CHUNK = 32


def sign(token: str, timestamp: int, body: bytes) -> str:
    """`t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>" keyed by the consumer token>`."""
    digest = hmac.new(token.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={digest.hexdigest()}"


def delivery_headers(
    job: PushJob, *, token_header: str, user_agent: str, now: float | None = None
) -> dict[str, str]:
    message = job.job
    headers = dict(message.headers)
    headers.update(
        {
            "Content-Type": message.content_type,
            "X-Broker-Message-Priority": str(message.priority),
            "X-Broker-Message-ID": message.message_id,
            "X-Broker-Channel-ID": job.consumer.channel_id,
            "X-Broker-Consumer-ID": job.consumer.id,
            token_header: job.consumer.token,
            "User-Agent": user_agent,
            "X-Request-ID": uuid.uuid4().hex,
            "X-Broker-Delivery-Attempt": str(job.job.attempt),
            SIGNATURE_HEADER: sign(job.consumer.token, int(now or time.time()), message.payload),
        }
    )
    if message.headers:
        headers["X-Broker-Metadata-Headers"] = ",".join(message.headers)
    return headers


class Dispatcher:
    """At most `max_workers` deliveries in flight; idle, it queries no more often than needed."""

    def __init__(
        self,
        push: PushService,
        signals: Signals,
        http: httpx.AsyncClient,
        *,
        max_workers: int,
        idle_seconds: float,
        token_header: str,
        user_agent: str,
    ) -> None:
        self._push = push
        self._signals = signals
        self._http = http
        self._max_workers = max_workers
        self._idle = idle_seconds
        self._token_header = token_header
        self._user_agent = user_agent
        self._tasks: set[asyncio.Task[None]] = set()
        self._slot_freed = asyncio.Event()
        # 2xx answers not yet recorded: one task records all that arrived meanwhile in one
        # transaction (a transaction per job cost more CPU than the POST).
        self._answered: list[PushJob] = []
        self._answered_more = asyncio.Event()
        self._closing = False

    async def run(self, stop: asyncio.Event) -> None:
        recorder = asyncio.create_task(self._record_answered(), name="push-outcomes")
        try:
            with self._signals.subscribe(ANY_CONSUMER) as woken:
                while not stop.is_set():
                    woken.clear()
                    wait = self._idle
                    try:
                        wait = await self.dispatch_once()
                    except Exception:
                        log.exception("push claim failed; retrying after the idle interval")
                    await self._sleep(stop, woken, wait)
            await self.drain()
            self._closing = True
            self._answered_more.set()
            await recorder
        finally:
            recorder.cancel()

    async def dispatch_once(self) -> float:
        """Claim into every free worker slot; returns how long to wait before the next claim."""
        self._slot_freed.clear()
        free = self._max_workers - len(self._tasks)
        if free <= 0:
            return self._idle
        # Claim in chunks: a lease starts at the claim, so claiming hundreds at once would let
        # the last of them wait out much of their lease before their request even starts.
        limit = min(free, CLAIM_CHUNK)
        claim = await self._push.claim(limit)
        for job in claim.jobs:
            task = asyncio.create_task(self._deliver(job), name=f"push-{job.job.id}")
            self._tasks.add(task)
            task.add_done_callback(self._finished)
        if len(claim.jobs) == limit:
            # More may be due: claim again at once, or, with every slot busy, when one frees.
            return 0.0 if limit < free else self._idle
        if claim.next_due_at is None:
            return self._idle
        until_due = (claim.next_due_at - datetime.now(UTC)).total_seconds()
        return max(0.01, min(self._idle, until_due))

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slot_freed.set()

    async def _sleep(self, stop: asyncio.Event, woken: asyncio.Event, seconds: float) -> None:
        waiters = [
            asyncio.ensure_future(stop.wait()),
            asyncio.ensure_future(woken.wait()),
            asyncio.ensure_future(self._slot_freed.wait()),
        ]
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def drain(self) -> None:
        """Let in-flight deliveries finish (each is bounded by the HTTP timeout)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks))

    async def _record_answered(self) -> None:
        while not (self._closing and not self._answered):
            await self._answered_more.wait()
            self._answered_more.clear()
            answered, self._answered = self._answered, []
            if not answered:
                continue
            try:
                await self._push.delivered(answered)
            except Exception:
                # Their leases are still in the database: the sweeper requeues them.
                log.exception("recording %d delivered jobs failed", len(answered))

    async def _deliver(self, job: PushJob) -> None:
        message = job.job
        headers = delivery_headers(
            job, token_header=self._token_header, user_agent=self._user_agent
        )
        error: str | None = None
        try:
            response = await self._http.post(
                job.consumer.callback_url, content=message.payload, headers=headers
            )
            if not 200 <= response.status_code < 300:
                error = f"HTTP {response.status_code}"
        except httpx.TimeoutException:
            error = "timed out"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if error is None:
            self._answered.append(job)
            self._answered_more.set()
            return
        try:
            status = await self._push.failed(job, error)
            log.info("push of job %s failed (%s); now %s", job.job.id, error, status)
        except Exception:
            # The lease is still in the database: the sweeper will retry this job.
            log.exception("recording the outcome of job %s failed", job.job.id)


# httpcore scans its whole pool on every request; a few dozen kept-alive connections serve
# a busy receiver as well as hundreds, at a fraction of the CPU.
MAX_KEEPALIVE = 32


def http_client(timeout_seconds: float, max_workers: int) -> httpx.AsyncClient:
    """Pooled client; redirects are not followed (a 3xx is a failed delivery)."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout_seconds),
        follow_redirects=False,
        limits=httpx.Limits(
            max_connections=max_workers,
            max_keepalive_connections=min(max_workers, MAX_KEEPALIVE),
        ),
    )


async def close_quietly(client: httpx.AsyncClient) -> None:
    with contextlib.suppress(Exception):
        await client.aclose()
