"""The push dispatcher: claims due jobs of push consumers and POSTs them to callback URLs.

Nothing lives only in memory: a job is leased in the database before it is sent, and its
outcome is recorded with one fenced, conditional update. A crash mid-delivery leaves the job
INFLIGHT until its lease expires; then the sweeper requeues it and it is delivered again.

Each round reads the push consumers with their state (disabled, breaker) and claims for each
in turn, starting one further along each round, up to what its lane allows (app/dispatch/flow):
a slow or dead endpoint holds at most its own window, never the whole dispatcher's.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from app.dispatch.flow import Lane, retry_after_seconds
from app.dispatch.http import PUSHED_BACK, Answer, Poster
from app.domain.headers import forwardable
from app.domain.models import Breaker, Consumer, PulledJob
from app.domain.signing import Signer, secrets_in_force
from app.logging import log_failure
from app.services.pausing import pause_end
from app.services.push import PushJob, PushService, PushTarget
from app.services.signals import ANY_CONSUMER, Signals

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Broker-Signature"
# Jobs per claim statement: a lease starts at the claim, so a chunk must be sent well within
# it; 100 at the window's pace is a few milliseconds.
CLAIM_CHUNK = 100
# With the window nearly full, claiming as each slot frees made claims of a job or two: a
# statement each, re-planned for each new size (bench: 38 jobs a claim, 0.96 ms, most of it
# planning). A claim waits for CLAIM_FILL free slots (half the window, if that is fewer), so
# that a statement's fixed cost is spread over that many jobs whatever the window (it waited
# for a quarter of at most 100: two dispatchers sharing 200 then claimed 25 at a time; one
# dispatcher measured no different with 25 or 50 within the machine's noise: docs/performance.md,
# "Push delivery"), and takes one of a few sizes, so each size's statement is prepared once
# and keeps its plan. It waits CLAIM_WAIT at most: slots held by endpoints that hang must not
# keep the few free ones from the others.
CLAIM_FILL = 50
CLAIM_SIZES = (CLAIM_CHUNK, 75, 50, 25, 16, 8, 4, 2, 1)
CLAIM_WAIT = 0.05
# 2xx answers are recorded together: with fewer than this many waiting, the recorder lingers
# a moment for more (bench: a fifth of the acks had been of one job; with 64 and 4 ms, 72 jobs
# an ack).
ACK_BATCH = 64
ACK_LINGER = 0.004
# The push consumers are read again at once when a change of one is announced (Signals:
# in-process at commit, from other processes by NOTIFY); this bounds how long what is not
# announced lasts (breakers other dispatchers opened; SQLite shared between processes).
TARGETS_FOR = 1.0


# Request ids: one random prefix per process and a counter (a uuid4 per delivery showed in
# the dispatcher's profile).
_REQUEST_PREFIX = uuid.uuid4().hex[:16]
_REQUEST_IDS = (f"{_REQUEST_PREFIX}{n:016x}" for n in itertools.count())


def claim_size(room: int) -> int:
    """The largest of CLAIM_SIZES that fits `room` (0: none does)."""
    return next((size for size in CLAIM_SIZES if size <= room), 0)


def webhook_id(job: PulledJob) -> str:
    """Stable across the retries of one job: receivers deduplicate on it."""
    return f"job_{job.id}"


class Headers:
    """The headers of one claim's deliveries (one consumer, one moment): what they share is
    worked out once, then each job adds its own."""

    def __init__(
        self, consumer: Consumer, *, token_header: str, user_agent: str, moment: float
    ) -> None:
        push = consumer.push
        timestamp = int(moment)
        in_force = secrets_in_force(
            push.signing_secret,
            push.previous_signing_secret,
            push.previous_secret_until,
            datetime.fromtimestamp(moment, UTC),
        )
        self._token_header = token_header
        self._signer = Signer(consumer.token, in_force, timestamp)
        self._standard = bool(in_force)
        self._shared = {
            "X-Broker-Channel-ID": consumer.channel_id,
            "X-Broker-Consumer-ID": consumer.id,
            token_header: consumer.token,
            "User-Agent": user_agent,
        }
        if in_force:
            self._shared["webhook-timestamp"] = str(timestamp)

    def of(self, job: PulledJob) -> dict[str, str]:
        # The producer's, none of which may share a name with the broker's own in any case
        # (app/domain/headers; refused at publish, and filtered again here for messages
        # stored before that rule).
        forwarded = forwardable(job.headers, self._token_header) if job.headers else {}
        headers = dict(forwarded)
        headers.update(self._shared)
        headers["Content-Type"] = job.content_type
        headers["X-Broker-Message-Priority"] = str(job.priority)
        headers["X-Broker-Message-ID"] = job.message_id
        headers["X-Request-ID"] = next(_REQUEST_IDS)
        headers["X-Broker-Delivery-Attempt"] = str(job.attempt)
        headers[SIGNATURE_HEADER] = self._signer.broker(job.payload)
        if self._standard:
            identity = webhook_id(job)
            headers["webhook-id"] = identity
            headers["webhook-signature"] = self._signer.standard(identity, job.payload)
        if forwarded:
            headers["X-Broker-Metadata-Headers"] = ",".join(forwarded)
        return headers


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an answer means: delivered, deferred (429/503 with a readable Retry-After: `delay`
    seconds, capped), gone (410), refused (a link-local callback, never sent) or failed."""

    kind: str
    delay: float = 0.0


DELIVERED = Outcome("delivered")


def classify(answer: Answer, retry_after_max: float) -> Outcome:
    status = answer.status
    if status is not None and 200 <= status < 300:
        return DELIVERED
    if status in PUSHED_BACK:
        delay = retry_after_seconds(answer.retry_after)
        if delay is not None:
            return Outcome("deferred", min(delay, retry_after_max))
    if status == 410:
        return Outcome("gone")
    return Outcome("refused" if answer.refused else "failed")


class Dispatcher:
    """At most `max_workers` deliveries in flight; idle, it queries no more often than needed."""

    def __init__(
        self,
        push: PushService,
        signals: Signals,
        poster: Poster,
        *,
        max_workers: int,
        max_in_flight: int,
        retry_after_max: float,
        idle_seconds: float,
        token_header: str,
        user_agent: str,
        observe: Callable[[str, float], None] = lambda _outcome, _seconds: None,
        observe_round: Callable[[], None] = lambda: None,
    ) -> None:
        self._observe = observe
        # Told of each round that went through the push consumers (not the looks that found
        # too few free slots): something that waited for two has seen one start after it
        # began waiting, which claimed whatever was due then. Once per round, not per job.
        self._observe_round = observe_round
        self._push = push
        self._signals = signals
        self._poster = poster
        self._max_workers = max_workers
        self._max_in_flight = max_in_flight
        self._retry_after_max = retry_after_max
        self._idle = idle_seconds
        self._token_header = token_header
        self._user_agent = user_agent
        self._tasks: set[asyncio.Task[None]] = set()
        # Free slots a claim waits for (CLAIM_SIZES); a round per freed slot cost more than
        # the delivery.
        self._claim_at = max(1, min(CLAIM_FILL, max_workers // 2))
        self._claimed_at = 0.0  # when a round last went on to claim
        self._slot_freed = asyncio.Event()
        self._lanes: dict[int, Lane] = {}
        self._breakers: dict[int, Breaker] = {}  # as last seen here, to log each change once
        self._turn = 0
        self._targets_cache: list[PushTarget] | None = None
        self._targets_until = 0.0
        self._targets_version = signals.consumers_version  # of the changes the cache saw
        # Consumers whose failure count or breaker a success must reset (the rest are clean:
        # their successes write nothing but the jobs' own state).
        self._dirty: set[int] = set()
        # 2xx answers not yet recorded: one task records all that arrived meanwhile, in one
        # statement per consumer (a transaction per job cost more CPU than the POST).
        self._answered: list[PushJob] = []
        self._codes: list[int] = []  # each answered job's HTTP status, for its history
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
                        log_failure(log, "push claim failed; retrying after the idle interval")
                    await self._sleep(stop, woken, wait)
            await self.drain()
            self._closing = True
            self._answered_more.set()
            await recorder
        finally:
            recorder.cancel()

    def _lane(self, consumer: Consumer, now: float) -> Lane:
        limit = consumer.push.max_in_flight or self._max_in_flight
        lane = self._lanes.get(consumer.pk)
        if lane is None:
            lane = self._lanes[consumer.pk] = Lane(limit)
        lane.configure(limit, consumer.push.rate_limit, now)
        return lane

    async def dispatch_once(self) -> float:
        """Claim into free worker slots, consumer by consumer; returns how long to wait before
        the next round."""
        self._slot_freed.clear()
        free = self._max_workers - len(self._tasks)
        # Too few free slots to claim for: the slot that makes it enough wakes the next round,
        # and CLAIM_WAIT after the last claim the few free ones are claimed for all the same
        # (these looks run no statement).
        if free <= 0:
            return CLAIM_WAIT
        if free < self._claim_at:
            waited = time.monotonic() - self._claimed_at
            if waited < CLAIM_WAIT:
                return CLAIM_WAIT - waited
        self._claimed_at = time.monotonic()
        targets = await self._targets()
        if not targets:
            self._observe_round()
            return self._idle
        self._turn = (self._turn + 1) % len(targets)
        order = targets[self._turn :] + targets[: self._turn]
        now, wall = time.monotonic(), datetime.now(UTC)
        wait = self._idle
        short: list[Consumer] = []
        more = False
        for target in order:
            if free <= 0:
                more = True
                break
            consumer, state = target.consumer, target.state
            lane = self._lane(consumer, now)
            self._note_breaker(target)
            if state.disabled_at is not None:
                continue
            if consumer.paused_at(wall):
                # Its claims would find nothing (app/store/pauses); a resume is announced.
                ends = pause_end(consumer)
                if ends is not None:
                    wait = min(wait, (ends - wall).total_seconds())
                continue
            if state.breaker is not Breaker.CLOSED:
                if state.open_until is not None and state.open_until > wall:
                    wait = min(wait, (state.open_until - wall).total_seconds())
                    continue
                if lane.in_flight == 0 and await self._push.start_probe(consumer):
                    self._forget_targets()
                    log.info("push breaker of %s/%s: probing", consumer.channel_id, consumer.id)
                    free -= self._start(lane, await self._claim(consumer, 1))
                continue
            allowance = claim_size(min(lane.allowance(now), free))
            if allowance <= 0:
                token_in = lane.until_token()
                if token_in is not None:
                    wait = min(wait, token_in)
                continue
            jobs = await self._claim(consumer, allowance)
            free -= self._start(lane, jobs)
            if len(jobs) == allowance:
                more = True
            else:
                short.append(consumer)
        self._observe_round()
        if more:
            # More may be due: claim again at once, or, with every slot busy, when some free.
            return 0.0 if free > 0 else CLAIM_WAIT
        if short:
            next_due = await self._push.next_due(short)
            if next_due is not None:
                wait = min(wait, (next_due - datetime.now(UTC)).total_seconds())
        return max(0.01, wait)

    async def _claim(self, consumer: Consumer, limit: int) -> list[PushJob]:
        """Lease jobs of `consumer` as this dispatcher last read it. A change announced
        meanwhile (its callback moved, say) may have committed before the claim saw the jobs:
        they go out with the consumer as it is now, or back to the queue if it no longer
        pushes."""
        jobs = await self._push.claim(consumer, limit)
        if not jobs or self._signals.consumers_version == self._targets_version:
            return jobs
        fresh = {t.consumer.pk: t for t in await self._targets()}.get(consumer.pk)
        if fresh is not None and fresh.state.disabled_at is None:
            return [PushJob(job.job, fresh.consumer) for job in jobs]
        for job in jobs:
            await self._push.deferred(job, 0.0, "the consumer changed as its job was claimed")
        return []

    async def _targets(self) -> list[PushTarget]:
        """The push consumers and their state, read again when a change of one is announced
        and at most every TARGETS_FOR seconds otherwise (a round per claim would read them
        thousands of times a second under load); what this dispatcher learns itself (a
        breaker it opened, push it disabled) applies at once."""
        now = time.monotonic()
        version = self._signals.consumers_version
        if (
            self._targets_cache is None
            or now >= self._targets_until
            or version != self._targets_version
        ):
            # Noted before the read: a change announced during it makes the next look read
            # again.
            self._targets_version = version
            self._targets_cache = await self._push.targets()
            self._targets_until = now + TARGETS_FOR
            self._dirty |= {
                t.consumer.pk
                for t in self._targets_cache
                if t.state.failures or t.state.breaker is not Breaker.CLOSED
            }
        return self._targets_cache

    def _forget_targets(self) -> None:
        self._targets_cache = None

    def _start(self, lane: Lane, jobs: list[PushJob]) -> int:
        if not jobs:
            return 0
        common = Headers(
            jobs[0].consumer,
            token_header=self._token_header,
            user_agent=self._user_agent,
            moment=time.time(),
        )
        # Every job's headers before any starts: the lane counts none it will not end.
        headers = [common.of(job.job) for job in jobs]
        lane.started(len(jobs))
        for job, its_headers in zip(jobs, headers, strict=True):
            # Unnamed: a name per job cost.
            task = asyncio.create_task(self._deliver(job, lane, its_headers))
            self._tasks.add(task)
            task.add_done_callback(self._finished)
        return len(jobs)

    def _note_breaker(self, target: PushTarget) -> None:
        pk, now_state = target.consumer.pk, target.state.breaker
        if self._breakers.get(pk, Breaker.CLOSED) is not now_state:
            c = target.consumer
            log.warning("push breaker of %s/%s is now %s", c.channel_id, c.id, now_state.value)
        self._breakers[pk] = now_state

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._max_workers - len(self._tasks) >= self._claim_at:
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
            if len(self._answered) < ACK_BATCH and not self._closing:
                await asyncio.sleep(ACK_LINGER)
            answered, self._answered = self._answered, []
            codes, self._codes = self._codes, []
            if not answered:
                continue
            try:
                resets = {job.consumer.pk for job in answered} & self._dirty
                closed = await self._push.delivered(answered, resets, codes)
                self._dirty -= resets
            except Exception:
                # Their leases are still in the database: the sweeper requeues them.
                log_failure(log, "recording %d delivered jobs failed", len(answered))
                continue
            if closed:
                self._forget_targets()
            consumers = {job.consumer.pk: job.consumer for job in answered}
            for pk in closed:
                c = consumers[pk]
                log.warning("push breaker of %s/%s is now closed", c.channel_id, c.id)
                self._breakers[pk] = Breaker.CLOSED

    async def _deliver(self, job: PushJob, lane: Lane, headers: dict[str, str]) -> None:
        started = time.perf_counter()
        try:
            answer = await self._poster.post(job.consumer.callback_url, job.job.payload, headers)
        finally:
            lane.ended()
        outcome = classify(answer, self._retry_after_max)
        self._observe(outcome.kind, time.perf_counter() - started)
        if outcome.kind == "delivered":
            # Recorded with the others that arrive meanwhile (_record_answered).
            lane.succeeded()
            self._answered.append(job)
            self._codes.append(answer.status or 200)
            self._answered_more.set()
            return
        try:
            await self._record(job, lane, answer, outcome)
        except Exception:
            # The lease is still in the database: the sweeper will retry this job.
            log_failure(log, "recording the outcome of job %s failed", job.job.id)

    async def _record(self, job: PushJob, lane: Lane, answer: Answer, outcome: Outcome) -> None:
        """Any answer but a 2xx: each in a transaction of its own."""
        status = answer.status
        if status is None or status in PUSHED_BACK:
            # The receiver asked for time, or gave no answer at all: fewer at once.
            lane.pushed_back()
        if outcome.kind == "deferred":
            note = f"HTTP {status}, Retry-After {outcome.delay:g} s"
            await self._push.deferred(job, outcome.delay, note, status)
            return
        if outcome.kind == "gone":
            if await self._push.gone(job, "HTTP 410 Gone from the callback"):
                self._forget_targets()
                c = job.consumer
                log.warning("push to %s/%s disabled: HTTP 410 Gone", c.channel_id, c.id)
            return
        error = answer.error or f"HTTP {status}"
        self._dirty.add(job.consumer.pk)
        moved, state = await self._push.failed(job, error, status)
        log.info("push of job %s failed (%s); now %s", job.job.id, error, moved)
        if (
            state.breaker is Breaker.OPEN
            and self._breakers.get(job.consumer.pk) is not Breaker.OPEN
        ):
            c = job.consumer
            log.warning(
                "push breaker of %s/%s is now open until %s after %d failures",
                c.channel_id,
                c.id,
                state.open_until,
                state.failures,
            )
            self._breakers[c.pk] = Breaker.OPEN
            self._forget_targets()
